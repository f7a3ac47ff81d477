"""What the session concludes from a steady-state pass, kept while what it came from is the same.

In steady state each pass of a kind replays its save sequence under the same plan, and the
engine reports the same tuple of layers every time (:meth:`OffloadEngine.end_step` returns
the tuple of the last replayed pass when nothing in it changed). The session's conclusions
are then those of the pass before: the engine's schedule for the plan, the profile to plan
from, and whether it departs from the plan. Each is a walk over every layer (about a
millisecond a step for 1,000 layers on a CPU of 2026), so the session keeps them per pass
kind, keyed by the identity of what they were computed from.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from lightning_accudnn.ops import SwapSchedule
from lightning_accudnn.ops.layers import RecordName
from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.profile import LayerProfile
from lightning_accudnn.session.recompute_pass import schedule_for

__all__ = ["SteadyMemo"]


@dataclass(frozen=True, slots=True)
class _Conclusion:
    layers: tuple[LayerProfile, ...]
    static_bytes: int
    sources: tuple[object, ...]  # compared by identity: the plan run, the plan kept, the link
    profile: StepProfile
    departs: bool

    def holds_for(
        self, layers: tuple[LayerProfile, ...], static_bytes: int, sources: tuple[object, ...]
    ) -> bool:
        return (
            layers is self.layers
            and static_bytes == self.static_bytes
            and all(a is b for a, b in zip(sources, self.sources, strict=True))
        )


class SteadyMemo:
    """Per pass kind: the last schedule made for a plan, and the last replayed pass's conclusions.

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> layers = (LayerProfile("a", 100, 100),)
        >>> plan = plan_swaps(StepProfile(layers, 0), 1_000)
        >>> memo = SteadyMemo()
        >>> memo.schedule("pass", plan) is memo.schedule("pass", plan)
        True
        >>> memo.remember("pass", layers, 0, (plan,), StepProfile(layers, 0), departs=False)
        >>> memo.conclusion("pass", layers, 0, (plan,))[1]  # (profile, departs)
        False
        >>> memo.conclusion("pass", layers, 8, (plan,)) is None  # other model-state bytes
        True
    """

    def __init__(self) -> None:
        self._schedules: dict[Hashable, tuple[Plan, frozenset[RecordName] | None, SwapSchedule]] = {}
        self._conclusions: dict[Hashable, _Conclusion] = {}

    def schedule(self, key: Hashable, plan: Plan, held: frozenset[RecordName] | None = None) -> SwapSchedule:
        """:func:`schedule_for` ``plan``, made once per plan and ``held`` (the same objects) of the
        pass kind ``key``, keeping the storages of the ``held`` records on the device
        (:attr:`~lightning_accudnn.ops.SwapSchedule.held_records`)."""
        made = self._schedules.get(key)
        if made is None or made[0] is not plan or made[1] is not held:
            schedule = schedule_for(plan)
            if held:
                schedule = schedule.with_held_records(held)
            made = self._schedules[key] = (plan, held, schedule)
        return made[2]

    def conclusion(
        self, key: Hashable, layers: tuple[LayerProfile, ...], static_bytes: int, sources: tuple[object, ...]
    ) -> tuple[StepProfile, bool] | None:
        """``(profile, departs)`` remembered for ``key`` if they came from the same ``layers`` (the
        same object), ``static_bytes`` and ``sources`` (the same objects); else ``None``."""
        found = self._conclusions.get(key)
        if found is None or not found.holds_for(layers, static_bytes, sources):
            return None
        return found.profile, found.departs

    def remember(
        self,
        key: Hashable,
        layers: tuple[LayerProfile, ...],
        static_bytes: int,
        sources: tuple[object, ...],
        profile: StepProfile,
        *,
        departs: bool,
    ) -> None:
        """Keep what a replayed pass of ``key`` concluded: the profile to plan from, and whether
        it departs from its plan."""
        self._conclusions[key] = _Conclusion(layers, static_bytes, sources, profile, departs)

    def forget(self, key: Hashable) -> None:
        """A pass of ``key`` ran hooked (or its graph changed): what follows is computed anew."""
        self._conclusions.pop(key, None)
