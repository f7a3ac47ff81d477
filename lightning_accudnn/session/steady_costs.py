"""What the passes replayed under a plan measure: the forward, the backward, each recomputation.

A plan is made from passes timed layer by layer, with the engine's hooks on every module. On a
GPU whose host issues the forward, those hooks slow the forward they time: on an H200 the
ResNet-152 session keeping everything held 80.8 ms of forward and 103.4 ms of compute for a step
that ran in 70.5 ms (``bench/results/nvidia-h200/2026-11-26-at-ef99de4``, ``bench.calibration``).
Corrected by the steady forward alone, it held 42.7 ms against 59.5 ms: the backward its hooked
passes timed, 19.8 ms, was short too (``…-at-7c3059d``). And a recomputation is charged, until
one is timed, the forward time its layers took in such a pass
(:attr:`StepProfile.recompute_cost_ratio` 1.0).

So the first :data:`STEADY_TIMED_PASSES` passes replayed under each plan (not its hooked first
pass, and none while a plan is made on a thread: it shares the host) are timed as the steady
state runs them, and read at their end: the forward and the backward whole, less the time
compute waited on copies in each (the runtime times those waits in these passes,
:attr:`~lightning_accudnn.ops.StepStats.stall_seconds`), and each recomputation between two clock
marks (:class:`~lightning_accudnn.ops.timing.RecomputationTimer`), which the backward is taken
less too. The hooked first pass is not: it runs cold, and on the H200 the first pass under a plan
recomputing 7 segments of ResNet-152 made 43 ``cudaMalloc`` and 33 ``cudaFree`` calls and one
free-and-retry, and timed its recomputations at 7.1 times the forward they repeat, where the
plan recomputing 19 segments at the forward's cost measured 117.2 ms for 120.7 predicted.

The same passes time the host's work in the engine (its hooks, issuing and bringing back its
copies: :attr:`~lightning_accudnn.ops.StepStats.swap_host_seconds`). Where the passes are timed
on the host's clock (the CPU, whose host computes: its work is in the times, whole), the forward
and the backward are taken less it where the pass swapped, and profiles planned from then charge
it per swapped storage (:attr:`StepProfile.swap_host_seconds`, the least per storage timed), so
that a plan of many small storages is costed above one of few large ones. Where a device's
events time them (CUDA), a host that runs ahead of the device hides its work, and how much of it
shows in the device's time is not measured: plans there charge none per storage, and the session
reports what it measured (:attr:`~lightning_accudnn.session.OffloadStats.host_seconds_per_swapped_storage`).

Profiles planned from then charge a forward no longer than the fastest timed
(:func:`~lightning_accudnn.session.warm_times.scaled_forward`), the fastest backward timed
(:func:`~lightning_accudnn.session.warm_times.scaled_backward`), each segment timed its fastest
recomputation (:func:`~lightning_accudnn.session.warm_times.fastest_recomputations`), and the
others the timed ones' ratio of time to forward
(:func:`~lightning_accudnn.session.warm_times.with_recomputations`). Once the last timed pass
ends, a plan whose compute, recomputation or host time per swapped storage, charged so, moves
its step by more than
:data:`~lightning_accudnn.session.warm_times.RECOMPUTE_COST_TOLERANCE` is made again
(:meth:`SteadyCosts.recost_due`), once per pass kind: the plan made again is timed too (its
recomputations, for the plans to come), but not made again from its own timings, whose noise
would keep moving it.
"""

from __future__ import annotations

from dataclasses import replace

from lightning_accudnn.ops import StepStats
from lightning_accudnn.ops.timing import Clock, RecomputationTimer, WallClock
from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.warm_times import (
    fastest_recomputations,
    recompute_cost_ratio,
    scaled_backward,
    scaled_forward,
    with_recomputations,
)

__all__ = ["STEADY_TIMED_PASSES", "SteadyCosts"]

#: Passes replayed under a plan that are timed whole; the plan is re-costed from the fastest
#: once the last of them ends.
STEADY_TIMED_PASSES = 3


class SteadyCosts:
    """Each pass kind's forward, backward and recomputations as the steady state runs them, and
    the plans to re-cost from them.

    Example:
        >>> from lightning_accudnn.ops.timing import WallClock
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"b{i}.x", 100, 100, 1.0, 2.0) for i in range(4))
        >>> segments = tuple(SegmentProfile(f"b{i}", 10) for i in range(4))
        >>> plan = plan_swaps(StepProfile(layers, 0, segments=segments), 330, policy="recompute")
        >>> costs, key = SteadyCosts(WallClock(), passes=2), PassKey(model=1, batch=(), position=0)
        >>> for forward in (3.0, 2.5):  # two passes replayed under the plan
        ...     timed = costs.begin_pass(key, plan, hooked=False, contended=False)
        ...     timer = costs.timer_for(plan, hooked=False, timed=timed)
        ...     start = timer.clock.mark(); timer.record("b0", start)  # what recomputing b0 does
        ...     waited = (0.0, 1.0)  # compute waited on copies a second in backward
        ...     step = StepStats(0, 0, 0.0, 0, 0, forward, 9.0, layers=(), timed=False, stall_seconds=waited)
        ...     costs.pass_ended(key, plan, timer, step)
        >>> costs.recost_due(key), costs.timing(key)
        (True, False)
        >>> charged = costs.charged(key, plan.profile)
        >>> sum(layer.forward_seconds for layer in charged.layers)  # the faster pass's forward
        2.5
        >>> round(sum(layer.backward_seconds for layer in charged.layers), 3)  # 9 s less 1 s waiting
        8.0
        >>> charged.segments[0].recompute_seconds < 1.0, charged.recompute_cost_ratio < 1.0
        (True, True)
        >>> costs.begin_pass(key, plan, hooked=False, contended=False)  # timed in full
        False
    """

    def __init__(self, clock: Clock, passes: int = STEADY_TIMED_PASSES) -> None:
        self.passes = passes
        self._timer = RecomputationTimer(clock)
        self._times: dict[PassKey, dict[tuple[str, bool], float]] = {}
        self._forwards: dict[PassKey, float] = {}  # the fastest forward a timed pass computed
        self._backwards: dict[PassKey, float] = {}  # the fastest backward, less waits and recomputations
        # The least host seconds per swapped storage a timed pass spent, forward and backward.
        self._host_costs: dict[PassKey, tuple[float, float]] = {}
        # Passes timed on the host's clock hold the host's work in their times (see the module doc).
        self._host_clock = isinstance(clock, WallClock)
        # The last ratio asked for: the profile and the times it was computed from, and it.
        self._ratios: dict[PassKey, tuple[StepProfile, dict[tuple[str, bool], float], float | None]] = {}
        self._timed_passes: dict[PassKey, tuple[Plan, int]] = {}  # the plan timed, passes timed
        self._due: set[PassKey] = set()
        self._recosted: set[PassKey] = set()  # a re-cost made the plan again: never again
        self._plain_backwards: dict[PassKey, float] = {}
        self._hooked: list[tuple[str, float]] = []  # the hooked pass that just ended
        self._timing_now: PassKey | None = None  # the replayed pass running now is timed

    def begin_pass(self, key: PassKey, plan: Plan | None, *, hooked: bool, contended: bool) -> bool:
        """A pass of ``key`` is about to run under ``plan``: whether it is timed whole (then the
        engine times its waits, and reads it at its end). A replayed pass is, while fewer than
        :attr:`passes` were under ``plan`` (or a plan making the same choices), unless the host
        is ``contended`` (a plan in the making on a thread)."""
        self._timing_now = None
        if plan is None or hooked:
            return False
        timed_plan, count = self._timed_passes.get(key, (plan, 0))
        if not _same_choices(timed_plan, plan):  # a plan made again as it was runs as it ran
            count = 0
        if contended or count >= self.passes:
            return False
        self._timed_passes[key] = (plan, count + 1)
        self._timing_now = key
        return True

    def timer_for(self, plan: Plan | None, *, hooked: bool, timed: bool) -> RecomputationTimer | None:
        """The timer to set on the recomputer for a pass under ``plan``: a hooked pass times its
        recomputations (its backward is measured less them, :meth:`plain_backward`), and so does
        a pass timed whole (``timed``, :meth:`begin_pass`)."""
        if plan is None or not plan.recomputed or not (hooked or timed):
            return None
        return self._timer

    def pass_ended(
        self, key: PassKey, plan: Plan | None, timer: RecomputationTimer | None, step: StepStats
    ) -> None:
        """The pass :meth:`begin_pass` began ran its backward and measured ``step``."""
        recomputations = timer.take() if timer is not None else []
        self._hooked = recomputations if step.timed else []
        timing, self._timing_now = self._timing_now, None
        if step.timed or timing != key or plan is None:
            return
        _, ordinal = self._timed_passes[key]
        forward_stalls, backward_stalls = step.stall_seconds
        forward = step.forward_seconds - forward_stalls
        backward = step.backward_seconds - backward_stalls - sum(seconds for _, seconds in recomputations)
        storages = step.storages_swapped_out
        host_forward, host_backward = step.swap_host_seconds
        if storages and forward - host_forward > 0.0 and backward - host_backward > 0.0:
            per_storage = (host_forward / storages, host_backward / storages)
            known = self._host_costs.get(key, per_storage)
            self._host_costs[key] = (min(per_storage[0], known[0]), min(per_storage[1], known[1]))
            if self._host_clock:  # charged per swapped storage: the compute is without it
                forward -= host_forward
                backward -= host_backward
        if forward > 0.0:
            self._forwards[key] = min(forward, self._forwards.get(key, forward))
        if backward > 0.0:
            self._backwards[key] = min(backward, self._backwards.get(key, backward))
        if recomputations:
            self._times[key] = fastest_recomputations(
                recomputations, plan.selective, self._times.get(key, {})
            )
        if ordinal >= self.passes:
            self._due.add(key)

    def recost_due(self, key: PassKey) -> bool:
        """Whether ``key``'s plan was timed in full since the last call: it is then re-costed,
        unless a re-cost made ``key``'s plan again already (:meth:`recosted`): the plan made
        again from the passes timed whole is timed too, for the plans to come, but not made
        again from its own timings, whose noise would keep moving it."""
        due = key in self._due
        self._due.discard(key)
        return due and key not in self._recosted

    def recosted(self, key: PassKey) -> None:
        """A re-cost of ``key``'s plan made it again: the plan made then stays
        (:meth:`recost_due`), until a pass fails (:meth:`abandon`)."""
        self._recosted.add(key)

    def timing(self, key: PassKey) -> bool:
        """Whether passes of ``key`` are being timed whole, or were and the plan is not re-costed
        yet: the plan may be made again from them."""
        timed = self._timed_passes.get(key)
        return (timed is not None and timed[1] < self.passes) or key in self._due

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
        """``profile`` with a forward no longer than ``key``'s fastest timed one, its fastest
        timed backward (both less the engine's host work), the host's time per swapped storage
        timed, charging recomputation as timed (itself when nothing was timed)."""
        host_costs = self._host_costs.get(key) if self._host_clock else None
        if host_costs is not None and host_costs != profile.swap_host_seconds:
            profile = replace(profile, swap_host_seconds=host_costs)
        forward = self._forwards.get(key)
        if forward is not None:
            profile = scaled_forward(profile, forward)
        backward = self._backwards.get(key)
        if backward is not None:
            profile = scaled_backward(profile, backward)
        times = self._times.get(key)
        if not times:
            return profile
        return with_recomputations(profile, times, recompute_cost_ratio(profile, times))

    def host_seconds_per_storage(self, key: PassKey) -> float | None:
        """The least host seconds per swapped storage, forward and backward together, that the
        engine's own work took in ``key``'s passes timed whole (``None`` until a pass that
        swapped was timed), on any device: on a GPU, set against the step's host issue time, it
        tells whether the host holds the device up."""
        costs = self._host_costs.get(key)
        return None if costs is None else costs[0] + costs[1]

    def plain_backward(self, key: PassKey, backward_seconds: float) -> float:
        """The fastest backward a hooked pass of ``key`` under a plan that recomputes took,
        ``backward_seconds`` for the one that just ended, less its recomputations (the same work
        whatever the plan recomputes); 0 when none was."""
        plain = backward_seconds - sum(seconds for _, seconds in self._hooked)
        if self._hooked and plain > 0.0:
            self._plain_backwards[key] = min(plain, self._plain_backwards.get(key, plain))
        return self._plain_backwards.get(key, 0.0)

    def abandon(self) -> None:
        """A pass failed: forget its marks, and the timing under the plans in force (a plan made
        again after the failure is timed anew)."""
        self._timer.discard()
        self._hooked = []
        self._timing_now = None
        self._timed_passes.clear()
        self._recosted.clear()


def _same_choices(plan: Plan, other: Plan) -> bool:
    """Whether ``plan`` and ``other`` swap, recompute and prefetch alike (their passes run alike)."""
    return plan is other or (
        plan.swap == other.swap
        and plan.recomputed == other.recomputed
        and plan.selective == other.selective
        and plan.prefetch_window_bytes == other.prefetch_window_bytes
        and plan.max_copying_out_bytes == other.max_copying_out_bytes
    )
