"""A model of a stream-ordered caching allocator: per-stream pools of cached blocks under a cap."""

from __future__ import annotations

import bisect

_ROUND = 512  # bytes, the CUDA caching allocator's smallest block granularity


class SimulatedOutOfMemory(RuntimeError):
    """The simulated allocator could not reserve a block under its cap."""


def rounded(nbytes: int) -> int:
    """The size the allocator reserves for ``nbytes`` (multiples of 512 bytes, at least one).

    Example:
        >>> rounded(1), rounded(512), rounded(513)
        (512, 512, 1024)
    """
    return max(_ROUND, -(-nbytes // _ROUND) * _ROUND)


class StreamOrderedAllocator:
    """Blocks are allocated on a stream and freed back to that stream's pool.

    A free block is reused only by its own stream (as CUDA's caching allocator does without
    ``record_stream``); a request that does not fit under ``capacity_bytes`` first frees
    every cached block of every pool (a *retry*, counted in ``num_alloc_retries``) and then
    fails (counted in ``num_ooms``) with :class:`SimulatedOutOfMemory`.

    Example:
        >>> allocator = StreamOrderedAllocator(capacity_bytes=2048)
        >>> size = allocator.malloc("compute", 1000)
        >>> allocator.free("compute", size)
        >>> allocator.malloc("copy", 1500)  # the compute pool's cached block must be freed first
        1536
        >>> allocator.num_alloc_retries, allocator.num_ooms, allocator.peak_reserved_bytes
        (1, 0, 1536)
    """

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self._cached: dict[str, list[int]] = {}
        self.streams: set[str] = set()  # every stream that allocated
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0

    def malloc(self, stream: str, nbytes: int) -> int:
        """Reserve a block for ``nbytes`` on ``stream``; returns the block's size."""
        size = rounded(nbytes)
        self.streams.add(stream)
        pool = self._cached.setdefault(stream, [])
        index = bisect.bisect_left(pool, size)
        if index < len(pool) and pool[index] < 2 * size:
            size = pool.pop(index)
        else:
            if self.capacity_bytes is not None and self.reserved_bytes + size > self.capacity_bytes:
                self.num_alloc_retries += 1
                self.empty_cache()
                if self.reserved_bytes + size > self.capacity_bytes:
                    self.num_ooms += 1
                    raise SimulatedOutOfMemory(
                        f"simulated GPU out of memory: {size} more bytes on the {stream} stream would "
                        f"pass the cap of {self.capacity_bytes} bytes ({self.allocated_bytes} allocated). "
                        "Raise the budget or lower the batch size."
                    )
            self.reserved_bytes += size
        self.allocated_bytes += size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return size

    def free(self, stream: str, size: int) -> None:
        """Give a block back to the pool of the stream it was allocated on."""
        self.allocated_bytes -= size
        bisect.insort(self._cached.setdefault(stream, []), size)

    def empty_cache(self) -> None:
        """Release every cached (free) block of every stream."""
        for pool in self._cached.values():
            self.reserved_bytes -= sum(pool)
            pool.clear()
