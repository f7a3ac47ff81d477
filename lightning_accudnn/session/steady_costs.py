"""What the passes replayed under a plan measure: the forward's time, and each recomputation's.

A plan is made from passes timed layer by layer, with the engine's hooks on every module. On a
GPU whose host issues the forward, those hooks slow the forward they time: on an H200 the
ResNet-152 session keeping everything held 80.8 ms of forward and 103.4 ms of compute for a step
that ran in 70.5 ms (``bench/results/nvidia-h200/2026-11-26-at-ef99de4``, ``bench.calibration``).
And a recomputation is charged, until one is timed, the forward time its layers took in such a
pass (:attr:`StepProfile.recompute_cost_ratio` 1.0).

So the first :data:`STEADY_TIMED_PASSES` passes replayed under each plan (not its hooked first
pass, and none while a plan is made on a thread: it shares the host) are timed as the steady
state runs: each forward whole (the engine's pass timer: the fastest of the second and later,
the first may read a pass of the plan before), and each recomputation between two clock marks
(:class:`~lightning_accudnn.ops.timing.RecomputationTimer`), read once the device reached them,
so that no pass waits. The hooked first pass is not: it runs cold, and on the H200 the first
pass under a plan recomputing 7 segments of ResNet-152 made 43 ``cudaMalloc`` and 33
``cudaFree`` calls and one free-and-retry, and timed its recomputations at 7.1 times the forward
they repeat, where the plan recomputing 19 segments at the forward's cost measured 117.2 ms for
120.7 predicted.

Profiles planned from then charge a forward no longer than the fastest timed
(:func:`~lightning_accudnn.session.warm_times.scaled_forward`), each segment timed its fastest
recomputation (:func:`~lightning_accudnn.session.warm_times.fastest_recomputations`), and the
others the timed ones' ratio of time to forward
(:func:`~lightning_accudnn.session.warm_times.with_recomputations`). Once the last timed pass
is read, a plan whose forward or recomputation, charged so, moves its step by more than
:data:`~lightning_accudnn.session.warm_times.RECOMPUTE_COST_TOLERANCE` is made again
(:meth:`SteadyCosts.recost_due`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_accudnn.ops.timing import Clock, RecomputationTimer
from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.warm_times import (
    fastest_recomputations,
    recompute_cost_ratio,
    scaled_forward,
    with_recomputations,
)

__all__ = ["STEADY_TIMED_PASSES", "SteadyCosts"]

#: Passes replayed under a plan that are timed; the plan is re-costed from the fastest once the
#: last of them is read.
STEADY_TIMED_PASSES = 3


@dataclass(frozen=True)
class _TimedPass:
    key: PassKey
    plan: Plan
    ordinal: int  # 1 for the first pass timed under ``plan``


class SteadyCosts:
    """Each pass kind's forward and recomputations as the steady state runs them, and the plans
    to re-cost from them.

    Example:
        >>> from lightning_accudnn.ops.timing import WallClock
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"b{i}.x", 100, 100, 1.0, 2.0) for i in range(4))
        >>> segments = tuple(SegmentProfile(f"b{i}", 10) for i in range(4))
        >>> plan = plan_swaps(StepProfile(layers, 0, segments=segments), 330, policy="recompute")
        >>> costs, key = SteadyCosts(WallClock(), passes=2), PassKey(model=1, batch=(), position=0)
        >>> for forward in (3.0, 2.5):  # two passes replayed under the plan
        ...     timer = costs.begin_pass(key, plan, hooked=False, contended=False)
        ...     start = timer.clock.mark(); timer.record("b0", start)  # what recomputing b0 does
        ...     costs.pass_ended(key, plan, timer, hooked=False, forward_seconds=forward)
        >>> costs.read_arrived() == {key}, costs.recost_due(key), costs.timing(key)
        (True, True, False)
        >>> charged = costs.charged(key, plan.profile)
        >>> sum(layer.forward_seconds for layer in charged.layers)  # the second pass's forward
        2.5
        >>> charged.segments[0].recompute_seconds < 1.0, charged.recompute_cost_ratio < 1.0
        (True, True)
        >>> costs.begin_pass(key, plan, hooked=False, contended=False) is None  # timed in full
        True
    """

    def __init__(self, clock: Clock, passes: int = STEADY_TIMED_PASSES) -> None:
        self.passes = passes
        self._timer = RecomputationTimer(clock)
        self._times: dict[PassKey, dict[tuple[str, bool], float]] = {}
        self._forwards: dict[PassKey, float] = {}  # the fastest forward a replayed pass took
        # The last ratio asked for: the profile and the times it was computed from, and it.
        self._ratios: dict[PassKey, tuple[StepProfile, dict[tuple[str, bool], float], float | None]] = {}
        self._timed_passes: dict[PassKey, tuple[Plan, int]] = {}  # the plan timed, passes timed
        self._unread: dict[PassKey, int] = {}  # passes timed whose recomputations were not read yet
        self._due: set[PassKey] = set()
        self._plain_backwards: dict[PassKey, float] = {}
        self._hooked: list[tuple[str, float]] = []  # the hooked pass that just ended
        self._timing_now: PassKey | None = None  # the replayed pass running now is timed

    def begin_pass(
        self, key: PassKey, plan: Plan | None, *, hooked: bool, contended: bool
    ) -> RecomputationTimer | None:
        """A pass of ``key`` is about to run under ``plan``: the timer to set on the recomputer,
        or ``None``. A hooked pass times its recomputations (its backward is measured less them,
        :meth:`plain_backward`); a replayed one is timed while fewer than :attr:`passes` were
        under ``plan`` (or a plan making the same choices), unless the host is ``contended`` (a
        plan in the making on a thread)."""
        self._timing_now = None
        if plan is None:
            return None
        if hooked:
            return self._timer if plan.recomputed else None
        timed_plan, count = self._timed_passes.get(key, (plan, 0))
        if not _same_choices(timed_plan, plan):  # a plan made again as it was runs as it ran
            count = 0
        if contended or count >= self.passes:
            return None
        self._timed_passes[key] = (plan, count + 1)
        self._timing_now = key
        return self._timer if plan.recomputed else None

    def pass_ended(
        self,
        key: PassKey,
        plan: Plan | None,
        timer: RecomputationTimer | None,
        *,
        hooked: bool,
        forward_seconds: float,
    ) -> None:
        """The pass :meth:`begin_pass` began ran its backward, its forward timed at
        ``forward_seconds`` (a replayed pass: the engine's pass timer, the latest pass the device
        finished). A hooked pass's recomputations are read now, a replayed one's once the device
        reached them (:meth:`read_arrived`)."""
        self._hooked = []
        timing, self._timing_now = self._timing_now, None
        if hooked:
            if timer is not None:
                self._hooked = timer.take()
            return
        if timing != key or plan is None:
            return
        _, ordinal = self._timed_passes[key]
        if ordinal > 1 and forward_seconds > 0.0:
            self._forwards[key] = min(forward_seconds, self._forwards.get(key, forward_seconds))
        if timer is not None and timer.close_pass(_TimedPass(key, plan, ordinal)):
            self._unread[key] = self._unread.get(key, 0) + 1
        elif ordinal >= self.passes:  # nothing recomputed to read: timed in full now
            self._due.add(key)

    def read_arrived(self) -> set[PassKey]:
        """Read every timed pass the device finished; each segment keeps its fastest time. The
        kinds whose times were read; those whose last timed pass under their plan was read are
        due a re-cost."""
        read: set[PassKey] = set()
        for tag, times in self._timer.take_ready():
            assert isinstance(tag, _TimedPass)
            key = tag.key
            self._unread[key] -= 1
            self._times[key] = fastest_recomputations(times, tag.plan.selective, self._times.get(key, {}))
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

    def ratio(self, key: PassKey, profile: StepProfile) -> float | None:
        """What ``key``'s timed recomputations took over the forward ``profile`` gives the
        layers they repeat (``None`` until one was timed in a replayed pass). Asked every pass:
        kept until the profile or the times change."""
        times = self._times.get(key)
        if not times:
            return None
        memo = self._ratios.get(key)
        if memo is not None and memo[0] is profile and memo[1] is times:
            return memo[2]
        ratio = recompute_cost_ratio(profile, times)
        self._ratios[key] = (profile, times, ratio)
        return ratio

    def charged(self, key: PassKey, profile: StepProfile) -> StepProfile:
        """``profile`` with a forward no longer than ``key``'s fastest replayed one, charging
        recomputation as timed (itself when nothing was)."""
        forward = self._forwards.get(key)
        if forward is not None:
            profile = scaled_forward(profile, forward)
        times = self._times.get(key)
        if not times:
            return profile
        return with_recomputations(profile, times, recompute_cost_ratio(profile, times))

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
        self._timing_now = None
        self._unread.clear()
        self._timed_passes.clear()


def _same_choices(plan: Plan, other: Plan) -> bool:
    """Whether ``plan`` and ``other`` swap, recompute and prefetch alike (their passes run alike)."""
    return plan is other or (
        plan.swap == other.swap
        and plan.recomputed == other.recomputed
        and plan.selective == other.selective
        and plan.prefetch_window_bytes == other.prefetch_window_bytes
        and plan.max_copying_out_bytes == other.max_copying_out_bytes
    )
