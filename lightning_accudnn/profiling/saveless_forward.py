"""What a traced step's forward holds at each layer when it saves nothing: a recomputed segment's.

A recomputed segment's forward saves only its inputs: what it holds besides is what the model's
code and its ops hold (a layer's output until the next reads it, a residual block's input until
the addition). A traced step keeps every save alive, as autograd does, so its own forward
cannot tell those apart. :class:`SavelessForward` watches a second forward whose saves are
dropped (nothing is kept for a backward, which is never run) and counts, per layer, the most
bytes the storages that forward created held at once while the layer ran: what a session's
profiling pass, which swaps every save, measures beyond its ledger
(:attr:`~lightning_accudnn.profile.StepProfile.swapped_pass_forward_bytes`), less the copies it
has in flight.

A layer is one of the traced step's saving layers, in their order: bytes counted while a module
that saves nothing runs go to the saving layer that ran last (as a session's meter charges
them), or to none before the first.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from lightning_accudnn.ops.layers import LayerTracker
    >>> model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))
    >>> tracker = LayerTracker()
    >>> watch = SavelessForward(tracker, ["0", "1", "2"])
    >>> batch = torch.ones(32, 64)
    >>> with tracker.attached(model), watch.watching():
    ...     _ = model(batch)
    >>> watch.held_bytes()  # each layer's output (8 KiB) beside its input (the batch is not counted)
    {'0': 8192, '1': 16384, '2': 16384}
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_accudnn.profiling.kernels import tensors_in
from lightning_accudnn.profiling.working_memory import StorageLog

__all__ = ["SavelessForward"]


class _Running(Protocol):
    """A layer tracker's view of the layer running now (``ops.layers.LayerTracker`` fits)."""

    @property
    def current(self) -> str: ...


class SavelessForward:
    """Counts, per saving layer (``layers``, the traced step's, in order), the most bytes the
    storages created under :meth:`watching` held at once while that layer ran; ``tracker``
    names the layer running (its :attr:`current`). See the module docstring.

    ``block_bytes`` rounds each storage as the allocator planned for does (CUDA's: 512). The
    forward's own observers (a function mode rewriting calls as a GPU runs them) go around
    :meth:`watching`, the layer tracker attached.
    """

    def __init__(self, tracker: _Running, layers: Sequence[str], *, block_bytes: int = 1) -> None:
        self._tracker = tracker
        self._position = {name: position for position, name in enumerate(layers)}
        self._layers = tuple(layers)
        self._log = StorageLog(self._changed, block_bytes=block_bytes)
        self._alive = 0
        self._last: int | None = None  # the position of the saving layer that ran last
        self._top: dict[int, int] = {}

    def _changed(self, change: int) -> None:
        self._alive += change
        self._ran()

    def _ran(self) -> None:
        """An op ran, or the bytes held changed: the layer running now holds what is alive."""
        position = self._position.get(self._tracker.current, self._last)
        if position is None:
            return
        self._last = position
        if self._alive > self._top.get(position, 0):
            self._top[position] = self._alive

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Run the forward inside: its saves are dropped, the storages its kernels create counted
        (those of their inputs are known already: parameters, the batch, a view's base)."""
        log, ran = self._log, self._ran

        class _Created(TorchDispatchMode):  # type: ignore[no-untyped-call]
            def __torch_dispatch__(
                self,
                func: torch._ops.OpOverload,
                types: object,
                args: tuple[object, ...] = (),
                kwargs: dict[str, object] | None = None,
            ) -> object:
                kwargs = kwargs or {}
                for tensor in tensors_in((args, kwargs)):  # known from now on: not created here
                    log.key(tensor)
                out = func(*args, **kwargs)
                log.created(tensors_in(out))
                ran()  # an op that creates nothing (in place) runs in its layer all the same
                return out

        with (
            torch.autograd.graph.saved_tensors_hooks(_dropped, _never_read),
            _Created(),  # type: ignore[no-untyped-call]
        ):
            yield

    def held_bytes(self) -> dict[str, int]:
        """Per saving layer that ran, the most bytes held at once while it did."""
        return {self._layers[position]: nbytes for position, nbytes in sorted(self._top.items())}


def _dropped(tensor: torch.Tensor) -> None:
    """A save, dropped: the forward is not differentiated."""
    return None


def _never_read(packed: object) -> torch.Tensor:
    raise RuntimeError("a forward traced without its saves cannot be differentiated")
