"""A recomputed segment's arguments as they were at its call, to run its forward again from.

Checkpointing runs a segment's forward a second time in backward with the objects it was
first given. Two things can make those objects differ from what the first call saw:

* a container (list, tuple, dict) that the caller changes after the call: DenseNet passes
  each layer the list of the feature maps so far and appends to it after the layer returns;
* the identity of tensors: checkpointing saves each tensor argument through the saved-tensor
  hooks and gets a separate tensor back for each, so ``attention(x, x, x)`` is replayed as
  three distinct tensors, and code that branches on ``query is key`` (``nn.MultiheadAttention``)
  takes another path and saves other tensors.

:class:`SegmentInputs` records the arguments' structure at the call (fresh containers are
built for each replay, and a tensor passed several times is passed once to checkpointing and
put back in every place it held) and each tensor's version counter, so that a replay of
inputs written in place since the call is refused rather than run on other data.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

import torch

__all__ = ["SegmentInputs"]

_version = attrgetter("_version")
_dereference: Callable[[weakref.ref[torch.Tensor]], torch.Tensor | None] = weakref.ref.__call__
_VERSION_NAME, _NONE = repeat("_version"), repeat(None)  # endless: reused by every map over them


class SegmentInputs:
    """One call's arguments: how to rebuild ``(args, kwargs)`` from their distinct tensors.

    It holds no tensor (a recomputed segment's inputs are held by checkpointing, through the
    saved-tensor hooks that may swap them): :meth:`record` returns the distinct tensors beside
    it, and :meth:`rebuild` takes them back, or what the hooks gave back for them.

    Example:
        >>> x = torch.ones(2)
        >>> inputs, tensors = SegmentInputs.record((x, [x, 3]), {"scale": 2.0})
        >>> len(tensors)
        1
        >>> args, kwargs = inputs.rebuild((x.clone(),))
        >>> args[0] is args[1][0], args[1][1], kwargs
        (True, 3, {'scale': 2.0})
        >>> inputs.changed_since_call() is None
        True
        >>> _ = x.add_(1)
        >>> inputs.changed_since_call()
        'its tensor argument 0 (shape (2,)) was written in place after the call'
    """

    __slots__ = ("_structure", "_versions", "_references")

    def __init__(self, structure: tuple[Any, Any] | None, tensors: Sequence[torch.Tensor]) -> None:
        self._structure = structure  # None: the call's arguments were its distinct tensors, in order
        self._versions: tuple[int, ...] = tuple(map(_version, tensors))
        self._references = tuple(map(weakref.ref, tensors))

    @classmethod
    def record(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[SegmentInputs, tuple[torch.Tensor, ...]]:
        """The call's arguments recorded, and their distinct tensors in order."""
        if not kwargs and ((len(args) == 1 and isinstance(args[0], torch.Tensor)) or _distinct_tensors(args)):
            return cls(None, args), args
        tensors: list[torch.Tensor] = []
        positions: dict[int, int] = {}
        structure = (_flatten(args, tensors, positions), _flatten(kwargs, tensors, positions))
        return cls(structure, tensors), tuple(tensors)

    def rebuild(self, tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` as at the call, in new containers, with ``tensors`` (one per
        distinct tensor, in :meth:`record`'s order) in place of the recorded ones."""
        if self._structure is None:
            return tuple(tensors), {}
        args_structure, kwargs_structure = self._structure
        return _build(args_structure, tensors), _build(kwargs_structure, tensors)

    def changed_since_call(self) -> str | None:
        """Why a replay would not see what the call saw (a tensor argument, still alive, written
        in place since the call), or ``None``."""
        # Each tensor's version now (``None`` for one that died), compared in a few C calls.
        if tuple(map(getattr, map(_dereference, self._references), _VERSION_NAME, _NONE)) == self._versions:
            return None
        for index, (reference, version) in enumerate(zip(self._references, self._versions, strict=True)):
            tensor = reference()
            if tensor is not None and tensor._version != version:
                return (
                    f"its tensor argument {index} (shape {tuple(tensor.shape)}) was written in place "
                    "after the call"
                )
        return None


def _distinct_tensors(args: tuple[Any, ...]) -> bool:
    """Whether ``args`` are all tensors (subclasses too), no two the same object: the common
    call (a block called on its input), recorded as it is."""
    for value in args:
        if not isinstance(value, torch.Tensor):
            return False
    return len(args) < 2 or len({id(value) for value in args}) == len(args)


def _flatten(value: Any, tensors: list[torch.Tensor], positions: dict[int, int]) -> Any:
    """``value`` with every tensor replaced by its index among ``tensors`` (added when new);
    lists, tuples (named ones too) and dicts are walked and recorded as their type and items."""
    if isinstance(value, torch.Tensor):
        index = positions.get(id(value))
        if index is None:
            index = positions[id(value)] = len(tensors)
            tensors.append(value)
        return ("tensor", index)
    kind = type(value)
    if kind is list or kind is tuple or (isinstance(value, tuple) and hasattr(value, "_fields")):
        return ("sequence", kind, tuple(_flatten(item, tensors, positions) for item in value))
    if kind is dict:
        return ("dict", kind, tuple((key, _flatten(item, tensors, positions)) for key, item in value.items()))
    return ("leaf", value)


def _build(node: Any, tensors: tuple[torch.Tensor, ...]) -> Any:
    tag = node[0]
    if tag == "tensor":
        return tensors[node[1]]
    if tag == "leaf":
        return node[1]
    kind: Callable[..., Any] = node[1]
    if tag == "dict":
        return kind((key, _build(item, tensors)) for key, item in node[2])
    items = [_build(item, tensors) for item in node[2]]
    if kind is list:
        return items
    if kind is tuple:
        return tuple(items)
    return kind(*items)  # a named tuple
