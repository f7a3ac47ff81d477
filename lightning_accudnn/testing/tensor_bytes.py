"""An allocator's counts without a GPU: the bytes of the tensors a step's ops create, alive.

CUDA's caching allocator counts every block a tensor holds, whoever made it; the engine's ledger
counts model state and saved activations only. :class:`OpBytesAllocator` gives the session on
CPU what the CUDA allocator gives it on a GPU (:class:`~lightning_accudnn.session.allocator.AllocatorControl`:
peaks of allocated bytes, read at any moment), counting model state as a fixed number of bytes
and, while :meth:`OpBytesAllocator.counting` is entered, every storage an op creates, from its
creation to its release. So the working memory a hooked pass measures on CPU (a loss's float
copy of the logits, the gradients of activations) is what the same step holds on a GPU, less
the kernels' workspaces, which a CPU does not allocate. Enter it around the forward and the
backward of each step; nothing is capped. On CPU the engine's host buffers (where swapped
activations go) are made by ops too; on a GPU they are host memory, which the device's allocator
does not count, so neither does this one: a runtime makes them with
:func:`~lightning_accudnn.ops.host_allocation.new_host_buffer`, which says when it does. The
engine's copies brought back, flat ``uint8`` tensors too when a save was not its storage's dense
view, are device memory and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lightning_accudnn.ops.host_allocation import making_host_buffer
from lightning_accudnn.profiling.working_memory import StorageLog

__all__ = ["OpBytesAllocator"]


class OpBytesAllocator:
    """Allocated bytes: ``base_bytes`` (model state) plus the storages ops created, alive, but
    the engine's host buffers.

    Example:
        >>> allocator = OpBytesAllocator(base_bytes=1_000)
        >>> read = allocator.allocated_peak_reader()
        >>> with allocator.counting():
        ...     a = torch.ones(100)  # 400 bytes
        ...     b = a * 2  # 400 more
        ...     del a
        ...     first = read()
        ...     c = b + 1
        >>> first, read(), allocator.peaks()
        (1800, 1800, (1800, 1800))
        >>> del b, c  # the next peaks are since the last call, when they were alive
        >>> allocator.peaks(), allocator.peaks()
        ((1800, 1800), (1000, 1000))
    """

    def __init__(self, base_bytes: int = 0) -> None:
        self.base_bytes = base_bytes
        self.allocated_bytes = base_bytes
        self._read_peak = base_bytes  # the most since the last reading
        self._pass_peak = base_bytes  # the most since the last peaks()
        self._storages = StorageLog(on_change=self._changed)  # what the ops created, and when it died

    # -- AllocatorControl ------------------------------------------------------------------

    def cap(self, budget_bytes: int) -> None:
        """Nothing is capped on CPU."""

    def lift(self) -> None:
        """Nothing was capped."""

    def peaks(self) -> tuple[int, int] | None:
        """(peak allocated, the same for reserved) since the last call."""
        peak = max(self._pass_peak, self._read_peak)
        self._pass_peak = self._read_peak = self.allocated_bytes
        return peak, peak

    def allocated_peak_reader(self) -> Callable[[], int] | None:
        return self._read

    def _read(self) -> int:
        peak = self._read_peak
        self._pass_peak = max(self._pass_peak, peak)
        self._read_peak = self.allocated_bytes
        return peak

    # -- counting --------------------------------------------------------------------------

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the storages the ops run inside create (until they are released)."""
        with _CreatedStorages(self._storages):
            yield

    def _changed(self, nbytes: int) -> None:
        self.allocated_bytes += nbytes
        if self.allocated_bytes > self._read_peak:
            self._read_peak = self.allocated_bytes


class _CreatedStorages(TorchDispatchMode):
    """Logs the storage of every dense tensor an op returns that none of its inputs holds (a
    view or an in-place result holds an input's: the op created nothing), but a host buffer's."""

    def __init__(self, storages: StorageLog) -> None:
        super().__init__()
        self._storages = storages

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        storages = self._storages
        for leaf in tree_leaves((args, kwargs)):
            if _dense(leaf):
                storages.key(leaf)  # known from now on: not the op's creation, nothing counted
        result = func(*args, **kwargs)
        if not making_host_buffer():
            storages.created(leaf for leaf in tree_leaves(result) if _dense(leaf))
        return result


def _dense(leaf: object) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided
