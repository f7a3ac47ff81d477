"""What is in force while a segment's forward runs again in backward.

A recomputation must give autograd what the call gave and change nothing else. BatchNorm in
training updates its running statistics in place at every call, so while a segment is
recomputed every training-mode norm in it updates scratch statistics instead (its output,
computed from the batch's statistics as in forward, is bitwise the same; the scratch values
are never read by anything else), and :func:`is_recomputing` says so to hooks that must not
count the second call.

:class:`RecomputationScope` is made once per recomputed segment and entered around each of its
recomputations (any number of times, also nested). It keeps what a recomputation needs from one
to the next: the segment's module tree as it last saw it (a C-level comparison of every
module's submodules tells whether the tree changed since; if so it is walked again), the norms
in it, and for each norm scratch tensors made once and reused while the norm's statistics are
the same tensors (not one ``clone`` per statistic per recomputation: on a GPU each is a kernel
launch on the host's critical path).
"""

from __future__ import annotations

import threading
from operator import is_

import torch
from torch import nn

from lightning_accudnn.ops._torch_internals import (
    NORM_WITH_STATISTICS,
    buffers_of,
    children_ids,
    submodules_of,
)
from lightning_accudnn.ops.recompute_safety import BATCH_NORM_STATISTICS

__all__ = ["RecomputationScope", "is_recomputing"]

_recomputing = threading.local()


def is_recomputing() -> bool:
    """True while a segment's forward runs again in backward (for hooks that must not count it).

    Example:
        >>> is_recomputing()
        False
    """
    return bool(getattr(_recomputing, "depth", 0))


class _NormScratch:
    """One norm's scratch statistics, and the statistics they stand in for."""

    __slots__ = ("norm", "originals", "scratch")

    def __init__(self, norm: nn.Module) -> None:
        self.norm = norm
        self.originals: tuple[torch.Tensor | None, ...] = ()
        self.scratch: dict[str, torch.Tensor] = {}

    def swap(self) -> tuple[dict[str, torch.Tensor | None], dict[str, torch.Tensor | None]]:
        """Put the scratch statistics in the norm; what it had before, to put back."""
        buffers = buffers_of(self.norm)
        before = buffers.copy()
        current = tuple(map(before.get, BATCH_NORM_STATISTICS))
        if len(current) != len(self.originals) or not all(map(is_, current, self.originals)):
            # First use, or the statistics were replaced (moved, loaded, or a scratch of an
            # enclosing recomputation is in force): new scratch tensors for these ones.
            self.originals = current
            self.scratch = {
                name: buffer.clone()
                for name, buffer in zip(BATCH_NORM_STATISTICS, current, strict=True)
                if buffer is not None
            }
        buffers.update(self.scratch)
        return buffers, before


class RecomputationScope:
    """Around each recomputation of the segment ``module``: its training norms update scratch
    statistics, and :func:`is_recomputing` is true.

    Each entry uses the segment's module tree as it is then: a norm put in the tree, or switched
    to training, since the last entry is seen (the tree is walked again when any module's
    submodules changed). It can be entered any number of times, also nested; each exit puts
    back what its entry swapped, in reverse order.

    Example:
        >>> norm = nn.BatchNorm1d(2)
        >>> scope = RecomputationScope(nn.Sequential(nn.Linear(2, 2), norm))
        >>> running_mean = norm.running_mean
        >>> with scope:
        ...     _ = norm(torch.randn(4, 2))
        ...     norm.running_mean is running_mean, is_recomputing()
        (False, True)
        >>> norm.running_mean is running_mean, bool(running_mean.eq(0).all()), is_recomputing()
        (True, True, False)
    """

    __slots__ = ("module", "_tree", "_children", "_norms", "_swapped")

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._tree: list[nn.Module] = []  # every module of the segment (held: their ids stay theirs)
        self._children: list[int] | None = None  # ids of each tree module's submodules, in order
        self._norms: list[_NormScratch] = []
        self._swapped: list[list[tuple[dict[str, torch.Tensor | None], dict[str, torch.Tensor | None]]]] = []

    def __enter__(self) -> None:
        if self._children is None or self._children != children_ids(self._tree):
            self._walk()
        swapped = []
        for scratch in self._norms:
            norm = scratch.norm
            if norm.training and norm.track_running_stats:
                swapped.append(scratch.swap())
        self._swapped.append(swapped)
        _recomputing.depth = getattr(_recomputing, "depth", 0) + 1

    def __exit__(self, *exc_info: object) -> None:
        _recomputing.depth -= 1
        for buffers, before in reversed(self._swapped.pop()):
            buffers.update(before)

    def _walk(self) -> None:
        """The segment's modules (each once, in a depth-first order) and norms, as they are now."""
        tree: list[nn.Module] = []
        seen: set[int] = set()
        pending: list[nn.Module | None] = [self.module]
        while pending:
            module = pending.pop()
            if module is None or id(module) in seen:  # a submodule registered as None, or shared
                continue
            seen.add(id(module))
            tree.append(module)
            pending.extend(reversed(submodules_of(module).values()))
        known = {id(scratch.norm): scratch for scratch in self._norms}
        self._norms = [
            known.get(id(module)) or _NormScratch(module)
            for module in tree
            if isinstance(module, NORM_WITH_STATISTICS)
        ]
        self._tree = tree
        self._children = children_ids(tree)
