"""Autocast's weight copies: the low-precision copy of a parameter that ``torch.autocast``
caches for the forward pass and a linear or convolution layer saves for backward.

Such a copy is no activation: it is model state in another dtype, alive while the autocast
cache (and then the saved graph) holds it, the same every step. Swapping it would copy the
weights to the host and back every step for nothing. It is recognised by its autograd
history: a ``ToCopyBackward0`` (possibly behind views such as the transpose ``nn.Linear``
saves) whose input is the ``AccumulateGrad`` of one of the model's parameters. Only
low-precision tensors are looked at, so full-precision training pays one dtype check.
"""

from __future__ import annotations

from collections.abc import Callable, Container

import torch

from lightning_accudnn.profile import ROOT_LAYER

__all__ = ["LOW_PRECISION", "WeightCopies"]

#: The dtypes autocast casts weights to.
LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Autograd nodes of views between a saved tensor and the cast it views.
_VIEWS = frozenset(
    {
        "TBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ExpandBackward0",
        "AliasBackward0",
    }
)
_MAX_VIEWS = 4


class WeightCopies:
    """Recognises autocast weight copies and counts their bytes (distinct storages) until taken,
    each under the layer that saved it first (``current_layer``: the one running then).

    Example:
        >>> layer = torch.nn.Linear(64, 32)
        >>> parameters = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        >>> copies, seen = WeightCopies(lambda: "fc"), []
        >>> def pack(tensor):
        ...     seen.append(copies.recognise(tensor, parameters))
        ...     return tensor
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        ...         out = layer(torch.randn(8, 64, requires_grad=True))
        >>> seen.count(True), copies.take()  # the bf16 weight (64 * 32 * 2 bytes), as its transpose
        (1, {'fc': 4096})
    """

    __slots__ = ("_bytes", "_current_layer")

    def __init__(self, current_layer: Callable[[], str] = lambda: ROOT_LAYER) -> None:
        self._bytes: dict[int, tuple[int, str]] = {}  # storage address -> (bytes, layer)
        self._current_layer = current_layer

    def recognise(self, tensor: torch.Tensor, parameter_storages: Container[int]) -> bool:
        """True when ``tensor`` is a low-precision copy of a parameter (or a view of one) made by
        a cast in this forward pass; its storage's bytes are then counted."""
        if tensor.dtype not in LOW_PRECISION:
            return False
        node = tensor.grad_fn
        for _ in range(_MAX_VIEWS + 1):
            if node is None:
                return False
            name = type(node).__name__
            if name == "ToCopyBackward0":
                return self._casts_a_parameter(node, tensor, parameter_storages)
            if name not in _VIEWS:
                return False
            node = node.next_functions[0][0]
        return False

    def _casts_a_parameter(
        self, node: torch.autograd.graph.Node, tensor: torch.Tensor, parameter_storages: Container[int]
    ) -> bool:
        source = node.next_functions[0][0]
        variable = getattr(source, "variable", None)  # set on AccumulateGrad nodes only
        if not isinstance(variable, torch.Tensor):
            return False
        if variable.untyped_storage().data_ptr() not in parameter_storages:
            return False
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._bytes:
            self._bytes[key] = (storage.nbytes(), self._current_layer())
        return True

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct weight copies recognised since the last :meth:`take`."""
        return sum(nbytes for nbytes, _ in self._bytes.values())

    def take(self) -> dict[str, int]:
        """The bytes recognised since the last call, per layer that saved them first; counting
        starts afresh (call once per pass)."""
        per_layer: dict[str, int] = {}
        for nbytes, layer in self._bytes.values():
            per_layer[layer] = per_layer.get(layer, 0) + nbytes
        self._bytes.clear()
        return per_layer
