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
in it, and for each norm scratch tensors made once and reused while the norm's buffers are the
same tensors (not one ``clone`` per statistic per recomputation: on a GPU each is a kernel
launch on the host's critical path). When every norm of the segment is in training (the common
case) the swap is a few C-level maps over the segment's norms, not Python per norm.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from itertools import chain
from operator import attrgetter

import torch
from torch import nn

from lightning_accudnn.ops._torch_internals import (
    NORM_WITH_STATISTICS,
    buffers_of,
    children_ids,
    submodules_of,
)
from lightning_accudnn.ops.recompute_safety import BATCH_NORM_STATISTICS

__all__ = ["RecomputationScope", "is_recomputing", "scratch_statistics_bytes"]

_recomputing = threading.local()
_Buffers = dict[str, torch.Tensor | None]
#: Whether a norm updates running statistics when called: both ``(True, True)``.
_modes = attrgetter("training", "track_running_stats")
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend  # runs an iterator out, in C


def scratch_statistics_bytes(model: nn.Module) -> int:
    """The most scratch statistics recomputations in ``model`` may keep on its device: the running
    statistics of each norm that updates them when called in training, which a
    :class:`RecomputationScope` copies once and keeps while its segment stays recomputed, once
    per segment the norm may be recomputed in: the norm itself and each module above it but the
    model (a stage recomputed around its recomputed blocks keeps a copy, and so does each block).

    Example:
        >>> untracked = nn.BatchNorm2d(8, track_running_stats=False)
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), untracked)
        >>> scratch_statistics_bytes(model)  # two 8-float statistics and the batch count
        72
        >>> scratch_statistics_bytes(nn.Sequential(nn.Sequential(model)))  # "0.0.1": three segments
        216
    """
    total = 0
    for name, module in model.named_modules():
        if isinstance(module, NORM_WITH_STATISTICS) and module.track_running_stats:
            buffers = buffers_of(module)
            statistics = sum(
                buffer.numel() * buffer.element_size()  # a clone's, whatever storage it views
                for statistic in BATCH_NORM_STATISTICS
                if (buffer := buffers.get(statistic)) is not None
            )
            total += statistics * (name.count(".") + 1 if name else 1)
    return total


def is_recomputing() -> bool:
    """True while a segment's forward runs again in backward (for hooks that must not count it).

    Example:
        >>> is_recomputing()
        False
    """
    return bool(getattr(_recomputing, "depth", 0))


class RecomputationScope:
    """Around each recomputation of the segment ``module``: its training norms update scratch
    statistics, and :func:`is_recomputing` is true.

    Each entry uses the segment's module tree as it is then: a norm put in the tree, or switched
    to training, since the last entry is seen (the tree is walked again when any module's
    submodules changed). It can be entered any number of times, also nested; each exit puts
    back what its entry swapped.

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

    __slots__ = (
        "module",
        "_tree",
        "_children",
        "_norms",
        "_training",
        "_originals",
        "_ids",
        "_scratch",
        "_swapped",
    )

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._tree: list[nn.Module] = []  # every module of the segment (held: their ids stay theirs)
        self._children: list[int] | None = None  # ids of each tree module's submodules, in order
        self._norms: list[nn.Module] = []  # the norms of the tree, each once
        self._training: list[tuple[bool, bool]] = []  # what ``_modes`` gives for each when all train
        # Per norm: its buffers when its scratch was made (held: their ids stay theirs), and its
        # scratch statistics; the ids of all those buffers, in order, compared at once.
        self._originals: list[tuple[torch.Tensor | None, ...]] = []
        self._scratch: list[dict[str, torch.Tensor]] = []
        self._ids: list[int] = []
        self._swapped: list[tuple[list[_Buffers], list[_Buffers]]] = []

    @property
    def scratch_bytes(self) -> int:
        """The scratch statistics this scope keeps (made at its norms' first recomputation)."""
        return sum(
            tensor.numel() * tensor.element_size() for scratch in self._scratch for tensor in scratch.values()
        )

    def __enter__(self) -> None:
        if self._children != children_ids(self._tree):
            self._walk()
        norms = self._norms
        if list(map(_modes, norms)) == self._training:  # every norm trains: swap them all at once
            dicts = list(map(buffers_of, norms))
            befores = list(map(dict.copy, dicts))
            if list(map(id, chain.from_iterable(map(dict.values, befores)))) != self._ids:
                for index, before in enumerate(befores):
                    self._renew(index, before)
            _consume(map(dict.update, dicts, self._scratch))
            self._swapped.append((dicts, befores))
        else:
            self._swapped.append(self._swap_training())
        _recomputing.depth = getattr(_recomputing, "depth", 0) + 1

    def __exit__(self, *exc_info: object) -> None:
        _recomputing.depth -= 1
        dicts, befores = self._swapped.pop()
        _consume(map(dict.update, dicts, befores))

    def _swap_training(self) -> tuple[list[_Buffers], list[_Buffers]]:
        """Swap the norms in training only, one by one."""
        dicts: list[_Buffers] = []
        befores: list[_Buffers] = []
        for index, norm in enumerate(self._norms):
            if norm.training and norm.track_running_stats:
                buffers = buffers_of(norm)
                before = buffers.copy()
                if list(map(id, before.values())) != list(map(id, self._originals[index])):
                    self._renew(index, before)
                buffers.update(self._scratch[index])
                dicts.append(buffers)
                befores.append(before)
        return dicts, befores

    def _renew(self, index: int, buffers: _Buffers) -> None:
        """New scratch statistics for norm ``index``, whose buffers are ``buffers`` (first use,
        or its buffers were replaced: moved, loaded, or a scratch of an enclosing recomputation
        is in force)."""
        self._originals[index] = tuple(buffers.values())
        self._scratch[index] = {
            name: buffer.clone()
            for name in BATCH_NORM_STATISTICS
            if (buffer := buffers.get(name)) is not None
        }
        self._ids = list(map(id, chain.from_iterable(self._originals)))

    def _walk(self) -> None:
        """The segment's modules (each once, in a depth-first order) and norms, as they are now
        (a norm seen before keeps its scratch statistics)."""
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
        known = {id(norm): index for index, norm in enumerate(self._norms)}
        norms = [module for module in tree if isinstance(module, NORM_WITH_STATISTICS)]
        indices = [known.get(id(norm)) for norm in norms]
        self._originals = [() if index is None else self._originals[index] for index in indices]
        self._scratch = [{} if index is None else self._scratch[index] for index in indices]
        self._ids = list(map(id, chain.from_iterable(self._originals)))
        self._norms = norms
        self._training = [(True, True)] * len(norms)
        self._tree = tree
        self._children = children_ids(tree)
