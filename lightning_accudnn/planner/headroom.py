"""The device memory a training pass may use: the budget, the reserve under it, what is usable.

One :class:`Headroom` value is what the session caps the allocator with (``budget_bytes``),
what it plans under (``usable_bytes``: the budget less the reserve) and what it grows when a
pass goes past its room (:meth:`Headroom.overshoot`, :meth:`Headroom.raised`); the planner
takes its two figures and plans under the same ``usable_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Headroom"]


@dataclass(frozen=True)
class Headroom:
    """A budget and the reserve kept free under it for what the plans do not count (the
    caching allocator's fragmentation, what the model of the step misses).

    Example:
        >>> room = Headroom(budget_bytes=8_000, reserve_bytes=1_000)
        >>> room.usable_bytes
        7000
        >>> room.overshoot(allocated_peak_bytes=7_500)  # 500 into the reserve
        500
        >>> room.raised(500).reserve_bytes
        1500
        >>> Headroom(budget_bytes=10, reserve_bytes=-1)
        Traceback (most recent call last):
        ...
        ValueError: reserve_bytes must be >= 0, got -1
    """

    budget_bytes: int
    reserve_bytes: int = 0

    def __post_init__(self) -> None:
        if self.reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {self.reserve_bytes}")

    @property
    def usable_bytes(self) -> int:
        """What a plan's predicted peak may reach: the budget less the reserve."""
        return self.budget_bytes - self.reserve_bytes

    def overshoot(self, allocated_peak_bytes: int) -> int:
        """How far a planned pass went past its room: its peak of allocated bytes (on CPU, of
        the engine's ledger) over the usable bytes. Its plan predicted at most those, so the
        model of the step fell short by at least as much; the reserve grows by it.

        Not the allocator's reserved bytes: under the cap it frees its cache and retries before
        it fails, and the cache left by earlier passes does not shrink with a smaller plan (on an
        H100, reserved bytes raised the reserve pass after pass until ResNet-18 at batch 32 was
        refused 1.5 GB, 1.6 times its plain allocated peak). A pass that does not fit fails with
        an out-of-memory error instead.
        """
        return max(0, allocated_peak_bytes - self.usable_bytes)

    def raised(self, nbytes: int) -> Headroom:
        """The same budget with ``nbytes`` more reserve."""
        return Headroom(self.budget_bytes, self.reserve_bytes + nbytes)
