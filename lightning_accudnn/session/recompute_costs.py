"""What recomputation costs each pass kind, timed in passes that run as the steady state does.

A plan charges each segment it recomputes a time. Until a recomputation is timed that is the
forward time its layers took in a timed pass (:attr:`StepProfile.recompute_cost_ratio` 1.0).
It is then timed in the first :data:`RECOMPUTE_TIMED_PASSES` passes replayed under the plan
(not the pass that first runs it, hooked), two clock marks around each recomputation
(:class:`~lightning_accudnn.ops.timing.RecomputationTimer`), read once the device reached
them, so that no pass waits.

The first pass under a new plan grows the allocator: on an H200, the first pass under a plan
recomputing 7 segments of ResNet-152 made 43 ``cudaMalloc`` and 33 ``cudaFree`` calls and one
free-and-retry, and timed its recomputations at 7.1 times the forward they repeat
(``bench/results/nvidia-h200/2026-11-26-at-ef99de4``); the plan that recomputed 19 segments at
the forward's cost measured 117.2 ms for 120.7 predicted. A pass that runs while a plan is made
on a thread shares the host with it, and a recomputation the device waits on the host for is
timed long: neither is timed.

Each segment keeps its fastest time (:func:`~lightning_accudnn.session.warm_times.fastest_recomputations`);
the segments never timed are charged the timed ones' ratio of time to forward
(:func:`~lightning_accudnn.session.warm_times.with_recomputations`). Once the last of those
passes is read, a plan whose recomputation, charged so, moves its step by more than
:data:`~lightning_accudnn.session.warm_times.RECOMPUTE_COST_TOLERANCE` is made again
(:meth:`RecomputeCosts.recost_due`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_accudnn.ops.timing import Clock, RecomputationTimer
from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.warm_times import (
    fastest_recomputations,
    recompute_cost_ratio,
    with_recomputations,
)

__all__ = ["RECOMPUTE_TIMED_PASSES", "RecomputeCosts"]

#: Passes replayed under a plan that recomputes whose recomputations are timed; the plan is
#: re-costed from the fastest of each segment once the last of them is read.
RECOMPUTE_TIMED_PASSES = 3


@dataclass(frozen=True)
class _TimedPass:
    key: PassKey
    plan: Plan
    ordinal: int  # 1 for the first pass timed under ``plan``


class RecomputeCosts:
    """Each pass kind's recomputations as timed, and the plans to re-cost from them.

    Example:
        >>> from lightning_accudnn.ops.timing import WallClock
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"b{i}.x", 100, 100, 1.0, 2.0) for i in range(4))
        >>> segments = tuple(SegmentProfile(f"b{i}", 10) for i in range(4))
        >>> plan = plan_swaps(StepProfile(layers, 0, segments=segments), 330, policy="recompute")
        >>> costs, key = RecomputeCosts(WallClock(), passes=1), PassKey(model=1, batch=(), position=0)
        >>> timer = costs.timer_for(key, plan, hooked=False, contended=False)
        >>> start = timer.clock.mark(); timer.record("b0", start)  # what recomputing b0 does
        >>> costs.pass_ended(key, plan, timer, hooked=False)
        >>> costs.read_arrived() == {key}, costs.recost_due(key), costs.timing(key)
        (True, True, False)
        >>> charged = costs.charged(key, plan.profile)
        >>> charged.segments[0].recompute_seconds < 1.0, charged.recompute_cost_ratio < 1.0
        (True, True)
        >>> costs.timer_for(key, plan, hooked=False, contended=False) is None  # timed in full
        True
    """

    def __init__(self, clock: Clock, passes: int = RECOMPUTE_TIMED_PASSES) -> None:
        self.passes = passes
        self._timer = RecomputationTimer(clock)
        self._times: dict[PassKey, dict[tuple[str, bool], float]] = {}
        self._ratios: dict[PassKey, float] = {}
        self._timed_passes: dict[PassKey, tuple[Plan, int]] = {}  # the plan timed, passes timed
        self._unread: dict[PassKey, int] = {}  # passes timed whose marks were not read yet
        self._due: set[PassKey] = set()
        self._plain_backwards: dict[PassKey, float] = {}
        self._hooked: list[tuple[str, float]] = []  # the hooked pass that just ended

    def timer_for(
        self, key: PassKey, plan: Plan | None, *, hooked: bool, contended: bool
    ) -> RecomputationTimer | None:
        """The timer a pass of ``key`` about to run under ``plan`` sets on the recomputer, or
        ``None``. A hooked pass times its recomputations (its backward is measured less them,
        :meth:`plain_backward`); a replayed one while fewer than :attr:`passes` were timed under
        ``plan``, unless the host is ``contended`` (a plan in the making on a thread)."""
        if plan is None or not plan.recomputed:
            return None
        if hooked:
            return self._timer
        timed_plan, count = self._timed_passes.get(key, (plan, 0))
        if timed_plan is not plan:
            count = 0
        if contended or count >= self.passes:
            return None
        self._timed_passes[key] = (plan, count + 1)
        return self._timer

    def pass_ended(
        self, key: PassKey, plan: Plan | None, timer: RecomputationTimer | None, *, hooked: bool
    ) -> None:
        """The pass :meth:`timer_for` gave ``timer`` ran its backward: a hooked one's times are
        read now, a replayed one's once the device reached them (:meth:`read_arrived`)."""
        self._hooked = []
        if timer is None or plan is None:
            return
        if hooked:
            self._hooked = timer.take()
            return
        _, ordinal = self._timed_passes[key]
        timer.close_pass(_TimedPass(key, plan, ordinal))
        self._unread[key] = self._unread.get(key, 0) + 1

    def read_arrived(self) -> set[PassKey]:
        """Read every timed pass the device finished; each segment keeps its fastest time, and
        the ratio they give against the plan's profile is the kind's. The kinds whose times
        were read; those whose last timed pass under their plan was read are due a re-cost."""
        read: set[PassKey] = set()
        for tag, times in self._timer.take_ready():
            assert isinstance(tag, _TimedPass)
            key, plan = tag.key, tag.plan
            self._unread[key] -= 1
            fastest = fastest_recomputations(times, plan.selective, self._times.get(key, {}))
            self._times[key] = fastest
            ratio = recompute_cost_ratio(plan.profile, fastest)
            if ratio is not None:
                self._ratios[key] = ratio
            if tag.ordinal >= self.passes:
                self._due.add(key)
            read.add(key)
        return read

    def recost_due(self, key: PassKey) -> bool:
        """Whether ``key``'s plan was timed in full since the last call: it is then re-costed."""
        due = key in self._due
        self._due.discard(key)
        return due

    def timing(self, key: PassKey) -> bool:
        """Whether passes of ``key`` are being timed, or timed and not read yet: a re-cost may follow."""
        timed = self._timed_passes.get(key)
        unfinished = timed is not None and timed[1] < self.passes
        return unfinished or self._unread.get(key, 0) > 0 or key in self._due

    def ratio(self, key: PassKey) -> float | None:
        """What ``key``'s timed recomputations took over the forward they repeat (``None``
        until one was timed in a replayed pass)."""
        return self._ratios.get(key)

    def charged(self, key: PassKey, profile: StepProfile) -> StepProfile:
        """``profile`` charging recomputation as timed for ``key`` (itself when nothing was)."""
        times = self._times.get(key)
        if not times:
            return profile
        return with_recomputations(profile, times, self._ratios.get(key))

    def plain_backward(self, key: PassKey, backward_seconds: float) -> float:
        """The fastest backward a hooked pass of ``key`` under a plan that recomputes took,
        ``backward_seconds`` for the one that just ended, less its recomputations (the same work
        whatever the plan recomputes); 0 when none was."""
        plain = backward_seconds - sum(seconds for _, seconds in self._hooked)
        if self._hooked and plain > 0.0:
            self._plain_backwards[key] = min(plain, self._plain_backwards.get(key, plain))
        return self._plain_backwards.get(key, 0.0)

    def abandon(self) -> None:
        """A pass failed: forget the marks not read, and the timing under the plans in force
        (a plan made again after the failure is timed anew)."""
        self._timer.drop()
        self._hooked = []
        self._unread.clear()
        self._timed_passes.clear()
