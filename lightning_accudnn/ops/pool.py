"""Host buffers for swapped activations, reused across steps, under a byte cap.

Pinned allocation (``cudaHostAlloc``) costs milliseconds per call, and a training step
asks for the same sizes every time, so buffers are kept by size and handed out again.
PyTorch's caching host allocator rounds every pinned request up to a power of two, so a
pinned pool asks for (and counts) the rounded size: the cap bounds the bytes really pinned.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

import torch

from lightning_accudnn.ops._torch_internals import empty_host_cache
from lightning_accudnn.ops.errors import HostMemoryExceeded
from lightning_accudnn.ops.host_allocation import new_host_buffer

_ALIGN = 512
_MAX_VIEWS = 4096  # remembered host views (a few hundred bytes each), and buffer sizes


def _bucket(nbytes: int) -> int:
    return max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)


def _power_of_two_at_least(nbytes: int) -> int:
    return 1 << (nbytes - 1).bit_length()


class HostBufferPool:
    """Byte buffers on the host, pinned when ``pin_memory`` is true, at most ``capacity_bytes``.

    :meth:`acquire` returns a flat ``uint8`` tensor of at least the asked size (rounded up
    to 512 bytes, then, with ``pinned_rounding``, to a power of two: what PyTorch's caching
    host allocator really pins) and :meth:`release` takes it back for reuse. Every byte
    count (the cap included) is of these rounded sizes (:meth:`host_bytes`).
    ``pinned_rounding`` defaults to ``pin_memory``; tests turn it on without a GPU. New
    buffers come from ``allocate`` (bytes in, a flat ``uint8`` host tensor out) when given: the
    engine's runtime, which times pinning apart from compute. When a
    new buffer would pass the cap, idle buffers of other sizes are freed first; if that is
    not enough :class:`HostMemoryExceeded` is raised.

    Example:
        >>> pool = HostBufferPool(pin_memory=False, capacity_bytes=2**20)
        >>> buffer = pool.acquire(1000)
        >>> buffer.numel(), pool.in_use_bytes
        (1024, 1024)
        >>> pool.release(buffer)
        >>> pool.acquire(1000) is buffer
        True
        >>> view = pool.typed_view(buffer, torch.float32, (25, 10), (10, 1))
        >>> view.shape, view.data_ptr() == buffer.data_ptr()
        (torch.Size([25, 10]), True)
        >>> pool.typed_view(buffer, torch.float32, (25, 10), (10, 1)) is view
        True
        >>> pool.can_hold(2**20)
        False
        >>> HostBufferPool(pin_memory=False, capacity_bytes=2**20, pinned_rounding=True).host_bytes(600_000)
        1048576
    """

    def __init__(
        self,
        pin_memory: bool,
        capacity_bytes: int,
        pinned_rounding: bool | None = None,
        allocate: Callable[[int], torch.Tensor] | None = None,
    ) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.pin_memory = pin_memory
        self._allocate = allocate if allocate is not None else self._empty
        self.pinned_rounding = pin_memory if pinned_rounding is None else pinned_rounding
        self.capacity_bytes = capacity_bytes
        self._idle: dict[int, list[torch.Tensor]] = defaultdict(list)
        # (buffer address, dtype, shape, stride) -> the buffer's first bytes so typed (:meth:`typed_view`)
        self._views: dict[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
        self._sizes: dict[int, int] = {}  # asked bytes -> :meth:`host_bytes`, for :meth:`acquire`
        self.allocated_bytes = 0
        self.in_use_bytes = 0
        self.allocations = 0

    @property
    def idle_bytes(self) -> int:
        return self.allocated_bytes - self.in_use_bytes

    def host_bytes(self, nbytes: int) -> int:
        """The host bytes a buffer for ``nbytes`` takes (what the cap counts)."""
        size = _bucket(nbytes)
        return _power_of_two_at_least(size) if self.pinned_rounding else size

    def can_hold(self, nbytes: int) -> bool:
        """Whether :meth:`acquire` of ``nbytes`` would succeed now (idle buffers may be freed)."""
        size = self.host_bytes(nbytes)
        return bool(self._idle.get(size)) or self.in_use_bytes + size <= self.capacity_bytes

    def acquire(self, nbytes: int) -> torch.Tensor:
        size = self._sizes.get(nbytes)
        if size is None:  # a step asks for the same sizes each time: worked out once
            if len(self._sizes) >= _MAX_VIEWS:
                self._sizes.clear()
            size = self._sizes[nbytes] = self.host_bytes(nbytes)
        idle = self._idle.get(size)
        if idle:
            buffer = idle.pop()
        else:
            if self.allocated_bytes + size > self.capacity_bytes:
                self.trim()
            if self.allocated_bytes + size > self.capacity_bytes:
                pinned = f" ({size} pinned)" if size != nbytes and self.pinned_rounding else ""
                raise HostMemoryExceeded(
                    f"swapping {nbytes} more bytes{pinned} would pass the host-memory cap "
                    f"({self.capacity_bytes} bytes; {self.in_use_bytes} in use). Raise host_memory_limit, "
                    "raise the device budget so that less is swapped, or lower the batch size."
                )
            buffer = self._new_buffer(size)
        self.in_use_bytes += size
        return buffer

    def _new_buffer(self, size: int) -> torch.Tensor:
        self.allocated_bytes += size
        self.allocations += 1
        return self._allocate(size)

    def _empty(self, size: int) -> torch.Tensor:
        return new_host_buffer(size, pin_memory=self.pin_memory)

    def typed_view(
        self, buffer: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...]
    ) -> torch.Tensor:
        """The first bytes of a buffer of this pool as a tensor of ``dtype``, ``shape`` and
        ``stride`` (dense: no gaps, no overlap), made once and handed out again (a step asks
        for the same ones each time)."""
        key = (buffer.data_ptr(), dtype, shape, stride)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= _MAX_VIEWS:  # shapes that change every step: start over
                self._views.clear()
            nbytes = math.prod(shape) * dtype.itemsize
            view = self._views[key] = buffer[:nbytes].view(dtype).as_strided(shape, stride)
        return view

    def release(self, buffer: torch.Tensor) -> None:
        size = buffer.numel()
        self.in_use_bytes -= size
        self._idle[size].append(buffer)

    def reserve(self, sizes: Iterable[int]) -> int:
        """Hold an idle buffer for each of ``sizes`` (the bytes of the buffers the passes to
        come hold at once) and no other idle buffer: the passes then allocate none, and what
        an earlier pass pinned beyond them (the profiling pass swaps everything) is freed.
        Returns the bytes allocated; raises :class:`HostMemoryExceeded` (changing nothing)
        when the buffers cannot all be held under the cap.

        Example:
            >>> pool = HostBufferPool(pin_memory=False, capacity_bytes=4096)
            >>> pool.reserve([1000, 1000, 2000])
            4096
            >>> pool.acquire(2000).numel(), pool.allocations
            (2048, 3)
            >>> pool.reserve([1000]), pool.allocated_bytes  # one idle 1024 freed, 2048 in use
            (0, 3072)
            >>> try:
            ...     pool.reserve([5000])
            ... except HostMemoryExceeded as error:
            ...     print(str(error)[:78])
            the plan swaps storages that need 5120 bytes of host buffers at once, over the
        """
        needed = Counter(self.host_bytes(nbytes) for nbytes in sizes)
        total = sum(size * count for size, count in needed.items())
        if self.in_use_bytes + total > self.capacity_bytes:
            raise HostMemoryExceeded(
                f"the plan swaps storages that need {total} bytes of host buffers at once, over the "
                f"host-memory cap ({self.capacity_bytes} bytes; {self.in_use_bytes} in use). Raise "
                "host_memory_limit, raise the device budget so that less is swapped, or lower the batch size."
            )
        missing = {size: count - len(self._idle.get(size, ())) for size, count in needed.items()}
        new_bytes = sum(size * count for size, count in missing.items() if count > 0)
        self._free_idle(lambda size: needed.get(size, 0))
        for size, count in missing.items():
            self._idle[size].extend(self._new_buffer(size) for _ in range(count))
        return new_bytes

    def trim(self) -> None:
        """Free every idle buffer (pinned memory goes back to the system, not only to
        PyTorch's host cache)."""
        self._free_idle(lambda size: 0)

    def _free_idle(self, keep: Callable[[int], int]) -> None:
        """Free the idle buffers of each size beyond the first ``keep(size)``."""
        freed = False
        for size, buffers in self._idle.items():
            while len(buffers) > keep(size):
                self.allocated_bytes -= buffers.pop().numel()
                freed = True
        if freed:
            self._views.clear()  # they would keep the freed buffers alive
            if self.pin_memory:
                empty_host_cache()
