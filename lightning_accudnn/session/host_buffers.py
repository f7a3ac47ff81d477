"""The pinned host buffers the planned passes need, held idle by the pool between passes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from lightning_accudnn.ops import OffloadEngine

__all__ = ["HostBufferReservation"]


class HostBufferReservation:
    """Have the pool hold, idle, the buffers the planned passes of every kind need (the most
    any one kind holds at once, per size): they allocate none in forward, and what the
    profiling pass pinned beyond that goes back to the system.

    Example:
        >>> import torch
        >>> reservation = HostBufferReservation(OffloadEngine(torch.device("cpu"), host_memory_limit=10**6))
        >>> reservation.reserve("pass a", [4096, 4096]); reservation.reserve("pass b", [4096, 8192])
        >>> sorted(reservation.needed().elements())
        [4096, 4096, 8192]
    """

    def __init__(self, engine: OffloadEngine) -> None:
        self.engine = engine  # its pool holds the buffers
        self._sizes: dict[Hashable, Counter[int]] = {}  # per planned pass kind, its host buffers

    def reserve(self, kind: Hashable, sizes: Iterable[int]) -> None:
        """Pass kind ``kind`` now swaps storages of ``sizes`` bytes."""
        pool = self.engine.pool
        self._sizes[kind] = Counter(pool.host_bytes(nbytes) for nbytes in sizes)
        pool.reserve(self.needed().elements())

    def needed(self) -> Counter[int]:
        """Per buffer size, the most buffers any one pass kind holds at once."""
        needed: Counter[int] = Counter()
        for counts in self._sizes.values():
            needed |= counts
        return needed
