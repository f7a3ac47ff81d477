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
does not count: ``host`` tells them apart (the engine's pool makes them ``uint8``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["OpBytesAllocator"]


class OpBytesAllocator:
    """Allocated bytes: ``base_bytes`` (model state) plus the storages ops created, alive, but
    those of the tensors ``host`` says are host memory.

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

    def __init__(self, base_bytes: int = 0, host: Callable[[torch.Tensor], bool] | None = None) -> None:
        self.base_bytes = base_bytes
        self._host = host
        self.allocated_bytes = base_bytes
        self._read_peak = base_bytes  # the most since the last reading
        self._pass_peak = base_bytes  # the most since the last peaks()
        self._alive: dict[int, weakref.ref[torch.UntypedStorage]] = {}  # address -> storage

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
        with _CreatedStorages(self._created):
            yield

    def _created(self, tensor: torch.Tensor) -> None:
        if self._host is not None and self._host(tensor):
            return
        storage = tensor.untyped_storage()
        address = int(StorageWeakRef(storage).cdata)
        known = self._alive.get(address)
        if known is not None and known() is not None:
            return  # a view of a storage counted already
        nbytes = storage.nbytes()
        self._alive[address] = weakref.ref(storage, partial(self._released, address, nbytes))
        self.allocated_bytes += nbytes
        if self.allocated_bytes > self._read_peak:
            self._read_peak = self.allocated_bytes

    def _released(self, address: int, nbytes: int, reference: object) -> None:
        if self._alive.get(address) is reference:
            del self._alive[address]
        self.allocated_bytes -= nbytes


class _CreatedStorages(TorchDispatchMode):
    """Tells ``created`` of the storage of every dense tensor an op returns that none of its
    inputs holds (a view or an in-place result holds an input's: the op created nothing)."""

    def __init__(self, created: Callable[[torch.Tensor], None]) -> None:
        super().__init__()
        self._created_storage = created

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        inputs = {_address(leaf) for leaf in tree_leaves((args, kwargs)) if _dense(leaf)}
        result = func(*args, **kwargs)
        for leaf in tree_leaves(result):
            if _dense(leaf) and _address(leaf) not in inputs:
                self._created_storage(leaf)
        return result


def _dense(leaf: object) -> bool:
    return isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided


def _address(tensor: torch.Tensor) -> int:
    return int(StorageWeakRef(tensor.untyped_storage()).cdata)
