"""The passes replayed under a plan are timed whole (forward, backward less waits and
recomputations, each recomputation), and the plan is due a re-cost once the last of them ends."""

from __future__ import annotations

import pytest

from lightning_accudnn.ops import StepStats
from lightning_accudnn.ops.timing import WallClock
from lightning_accudnn.planner import StepProfile, plan_swaps
from lightning_accudnn.profile import LayerProfile, SegmentProfile
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.steady_costs import STEADY_TIMED_PASSES, SteadyCosts

KEY = PassKey(model=1, batch=(), position=0)


class StepClock(WallClock):
    """Marks are numbers the host hands out, a millisecond apart."""

    def __init__(self) -> None:
        self.next = 0

    def mark(self) -> float:
        self.next += 1
        return self.next * 1e-3


def _plan():
    layers = tuple(LayerProfile(f"b{i}.x", 100, 100, 1.0, 2.0) for i in range(4))
    segments = tuple(SegmentProfile(f"b{i}", 10) for i in range(4))
    plan = plan_swaps(StepProfile(layers, 0, segments=segments), 330, policy="recompute")
    assert plan.recomputed == ("b0",)
    return plan


def _step(forward=0.0, backward=0.0, stalls=(0.0, 0.0), timed=False) -> StepStats:
    return StepStats(0, 0, 0.0, 0, 0, forward, backward, layers=(), timed=timed, stall_seconds=stalls)


def _run_pass(costs, plan, clock, *, contended=False, marks_apart=5, step=None):
    """A replayed pass under ``plan``, recomputing b0 for ``marks_apart`` ms: whether it was timed."""
    timed = costs.begin_pass(KEY, plan, hooked=False, contended=contended)
    timer = costs.timer_for(plan, hooked=False, timed=timed)
    if timer is not None:
        start = clock.mark()
        clock.next += marks_apart - 1
        timer.record("b0", start)
    costs.pass_ended(KEY, plan, timer, step or _step())
    return timed


def test_replayed_passes_are_timed_until_the_last_makes_a_recost_due():
    clock, plan = StepClock(), _plan()
    costs = SteadyCosts(clock)
    for _ in range(STEADY_TIMED_PASSES - 1):
        assert _run_pass(costs, plan, clock)
        assert costs.timing(KEY) and not costs.recost_due(KEY)
    assert _run_pass(costs, plan, clock)
    assert costs.timing(KEY)  # due: not re-costed yet
    assert costs.recost_due(KEY) and not costs.recost_due(KEY)  # once
    assert not costs.timing(KEY)
    assert not _run_pass(costs, plan, clock)  # timed in full: the steady state runs untimed
    charged = costs.charged(KEY, plan.profile)
    assert charged.segments[0].recompute_seconds == pytest.approx(5e-3)  # 5 marks apart
    assert charged.recompute_cost_ratio == pytest.approx(5e-3 / 1.0)
    assert costs.ratio(KEY, charged) == pytest.approx(5e-3)


def test_each_segment_keeps_its_fastest_recomputation():
    clock, plan = StepClock(), _plan()
    costs = SteadyCosts(clock)
    for apart in (40, 3, 9):
        _run_pass(costs, plan, clock, marks_apart=apart)
    assert costs.charged(KEY, plan.profile).segments[0].recompute_seconds == pytest.approx(3e-3)


def test_the_fastest_compute_is_charged_the_backward_less_its_waits_and_recomputations():
    layers = (LayerProfile("a", 100, 100, 4.0, 8.0), LayerProfile("b", 100, 100, 4.0, 2.0))
    plan = plan_swaps(StepProfile(layers, 0), 10**6)
    costs = SteadyCosts(StepClock())
    for forward, backward, stalls in (
        (6.0, 30.0, (0.0, 0.0)),
        (5.5, 25.0, (0.5, 5.0)),
        (7.0, 40.0, (0.0, 1.0)),
    ):
        assert costs.begin_pass(KEY, plan, hooked=False, contended=False)
        assert costs.timer_for(plan, hooked=False, timed=True) is None  # nothing recomputed
        costs.pass_ended(KEY, plan, None, _step(forward, backward, stalls))
    assert costs.recost_due(KEY)
    charged = costs.charged(KEY, plan.profile)
    forward = [layer.forward_seconds for layer in charged.layers]
    backward = [layer.backward_seconds for layer in charged.layers]
    assert forward == [2.5, 2.5]  # 5.5 less 0.5 waiting, never scaled up
    assert backward == pytest.approx([16.0, 4.0])  # 25 less 5 waiting: up, in proportion
    assert costs.charged(KEY, charged) is charged  # not twice


def test_a_contended_or_hooked_pass_is_not_timed_whole():
    clock, plan = StepClock(), _plan()
    costs = SteadyCosts(clock, passes=1)
    assert not _run_pass(costs, plan, clock, contended=True, step=_step(0.1, 0.1))
    assert costs.charged(KEY, plan.profile) is plan.profile
    assert not costs.begin_pass(KEY, plan, hooked=True, contended=False)
    assert _run_pass(costs, plan, clock)


def test_a_plan_making_other_choices_is_timed_anew_and_one_making_the_same_is_not():
    clock, first, again = StepClock(), _plan(), _plan()
    other = plan_swaps(first.profile, 330, policy="swap")
    assert other.recomputed != first.recomputed
    costs = SteadyCosts(clock, passes=1)
    assert _run_pass(costs, first, clock)
    assert not _run_pass(costs, first, clock)
    assert not _run_pass(costs, again, clock)  # made again as it was: runs as it ran
    assert _run_pass(costs, other, clock)


def test_a_hooked_pass_times_its_backward_less_its_recomputations_and_charges_nothing():
    clock, plan = StepClock(), _plan()
    costs = SteadyCosts(clock)
    assert not costs.begin_pass(KEY, plan, hooked=True, contended=True)
    timer = costs.timer_for(plan, hooked=True, timed=False)  # hooked passes always time
    assert timer is not None
    start = clock.mark()
    clock.next += 19
    timer.record("b0", start)
    costs.pass_ended(KEY, plan, timer, _step(0.5, 0.5, timed=True))
    assert costs.plain_backward(KEY, 0.5) == pytest.approx(0.5 - 20e-3)
    assert costs.charged(KEY, plan.profile) is plan.profile
    assert not costs.timing(KEY) and costs.ratio(KEY, plan.profile) is None


def test_a_failed_pass_forgets_its_marks_and_times_the_plan_again():
    clock, plan = StepClock(), _plan()
    costs = SteadyCosts(clock, passes=1)
    assert costs.begin_pass(KEY, plan, hooked=False, contended=False)
    timer = costs.timer_for(plan, hooked=False, timed=True)
    timer.record("b0", clock.mark())
    costs.abandon()
    assert timer.take() == []
    assert _run_pass(costs, plan, clock)


def test_a_plan_that_recomputes_nothing_has_no_recomputation_timer():
    profile = StepProfile((LayerProfile("a", 100, 100, 1.0, 2.0),), 0)
    costs = SteadyCosts(StepClock())
    for hooked, timed in ((False, True), (True, False)):
        assert costs.timer_for(plan_swaps(profile, 10**6), hooked=hooked, timed=timed) is None
        assert costs.timer_for(None, hooked=hooked, timed=timed) is None
    assert costs.timer_for(_plan(), hooked=False, timed=False) is None  # replayed, not timed


def _swapping_plan():
    layers = (
        LayerProfile("a", 100, 100, 4.0, 8.0, swappable_storages=4),
        LayerProfile("b", 100, 100, 4.0, 2.0, swappable_storages=6),
    )
    return plan_swaps(StepProfile(layers, 0), 200)


def _swapped_step(forward, backward, host, storages=4):
    return StepStats(
        0, 0, 0.0, 0, 0, forward, backward, layers=(), timed=False,
        storages_swapped_out=storages, swap_host_seconds=host,
    )  # fmt: skip


def test_the_engines_host_work_is_charged_per_swapped_storage_not_as_compute():
    plan = _swapping_plan()
    costs = SteadyCosts(StepClock())
    for forward, backward, host in ((6.0, 12.0, (0.4, 0.8)), (5.0, 11.0, (0.8, 0.4))):
        assert costs.begin_pass(KEY, plan, hooked=False, contended=False)
        costs.pass_ended(KEY, plan, None, _swapped_step(forward, backward, host))
    charged = costs.charged(KEY, plan.profile)
    assert charged.swap_host_seconds == (0.1, 0.1)  # the least per storage, forward and backward
    assert sum(layer.forward_seconds for layer in charged.layers) == pytest.approx(4.2)  # 5 less 0.8
    assert sum(layer.backward_seconds for layer in charged.layers) == pytest.approx(10.6)  # 11 less 0.4


def test_a_pass_that_swapped_nothing_charges_no_host_time_and_keeps_its_own():
    plan = _swapping_plan()
    costs = SteadyCosts(StepClock())
    assert costs.begin_pass(KEY, plan, hooked=False, contended=False)
    costs.pass_ended(KEY, plan, None, _swapped_step(6.0, 12.0, (0.4, 0.8), storages=0))
    charged = costs.charged(KEY, plan.profile)
    assert charged.swap_host_seconds == (0.0, 0.0)
    assert sum(layer.forward_seconds for layer in charged.layers) == pytest.approx(6.0)


class DeviceClock:
    """Marks a device's events would give: not the host's clock."""

    def mark(self) -> float:
        return 0.0

    def seconds_between(self, start: float, end: float) -> float:
        return end - start

    def ready(self, mark: float) -> bool:
        return True


def test_a_device_clock_reports_the_host_time_per_storage_and_charges_none():
    plan = _swapping_plan()
    costs = SteadyCosts(DeviceClock())
    assert costs.begin_pass(KEY, plan, hooked=False, contended=False)
    costs.pass_ended(KEY, plan, None, _swapped_step(6.0, 12.0, (0.4, 0.8)))
    assert costs.host_seconds_per_storage(KEY) == pytest.approx(0.3)  # (0.4 + 0.8) / 4
    charged = costs.charged(KEY, plan.profile)
    assert charged.swap_host_seconds == (0.0, 0.0)
    assert sum(layer.forward_seconds for layer in charged.layers) == pytest.approx(6.0)  # as timed


def test_a_plan_made_again_by_a_recost_is_timed_but_not_made_again_from_its_own_timings():
    clock, first, other = StepClock(), _plan(), None
    costs = SteadyCosts(clock, passes=1)
    assert _run_pass(costs, first, clock)
    assert costs.recost_due(KEY)  # the first plan's timings: re-costed
    costs.recosted(KEY)  # ... and made again
    other = plan_swaps(first.profile, 330, policy="swap")
    assert _run_pass(costs, other, clock)  # the plan made again is timed (its costs are kept)
    assert not costs.recost_due(KEY) and not costs.timing(KEY)  # but not re-costed
    costs.abandon()  # a failed pass: the plan made after it may be re-costed once
    assert _run_pass(costs, first, clock) and costs.recost_due(KEY)
