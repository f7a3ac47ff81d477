"""Host buffers for swapped activations, reused across steps, under a byte cap.

Pinned allocation (``cudaHostAlloc``) costs milliseconds per call, and a training step
asks for the same sizes every time, so buffers are kept by size and handed out again.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from lightning_accudnn.ops.errors import HostMemoryExceeded

_ALIGN = 512


def _bucket(nbytes: int) -> int:
    return max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)


class HostBufferPool:
    """Byte buffers on the host, pinned when ``pin_memory`` is true, at most ``capacity_bytes``.

    :meth:`acquire` returns a flat ``uint8`` tensor of at least the asked size (rounded up
    to 512 bytes) and :meth:`release` takes it back for reuse. When a new buffer would pass
    the cap, idle buffers of other sizes are freed first; if that is not enough
    :class:`HostMemoryExceeded` is raised.

    Example:
        >>> pool = HostBufferPool(pin_memory=False, capacity_bytes=2**20)
        >>> buffer = pool.acquire(1000)
        >>> buffer.numel(), pool.in_use_bytes
        (1024, 1024)
        >>> pool.release(buffer)
        >>> pool.acquire(1000) is buffer
        True
        >>> pool.can_hold(2**20)
        False
    """

    def __init__(self, pin_memory: bool, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.pin_memory = pin_memory
        self.capacity_bytes = capacity_bytes
        self._idle: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.allocated_bytes = 0
        self.in_use_bytes = 0
        self.allocations = 0

    @property
    def idle_bytes(self) -> int:
        return self.allocated_bytes - self.in_use_bytes

    def can_hold(self, nbytes: int) -> bool:
        """Whether :meth:`acquire` of ``nbytes`` would succeed now (idle buffers may be freed)."""
        size = _bucket(nbytes)
        return bool(self._idle.get(size)) or self.in_use_bytes + size <= self.capacity_bytes

    def acquire(self, nbytes: int) -> torch.Tensor:
        size = _bucket(nbytes)
        idle = self._idle.get(size)
        if idle:
            buffer = idle.pop()
        else:
            if self.allocated_bytes + size > self.capacity_bytes:
                self.trim()
            if self.allocated_bytes + size > self.capacity_bytes:
                raise HostMemoryExceeded(
                    f"swapping {nbytes} more bytes would pass the host-memory cap "
                    f"({self.capacity_bytes} bytes; {self.in_use_bytes} in use). Raise host_memory_limit, "
                    "raise the device budget so that less is swapped, or lower the batch size."
                )
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin_memory)
            self.allocated_bytes += size
            self.allocations += 1
        self.in_use_bytes += size
        return buffer

    def release(self, buffer: torch.Tensor) -> None:
        size = buffer.numel()
        self.in_use_bytes -= size
        self._idle[size].append(buffer)

    def trim(self) -> None:
        """Free every idle buffer."""
        for buffers in self._idle.values():
            for buffer in buffers:
                self.allocated_bytes -= buffer.numel()
        self._idle.clear()
