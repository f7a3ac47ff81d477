"""The passes replayed under a plan time its forward and recomputations, read once the device
reached them, and the plan is due a re-cost once the last of them is read."""

from __future__ import annotations

import pytest

from lightning_accudnn.planner import StepProfile, plan_swaps
from lightning_accudnn.profile import LayerProfile, SegmentProfile
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.steady_costs import STEADY_TIMED_PASSES, SteadyCosts

KEY = PassKey(model=1, batch=(), position=0)


class DeviceClock:
    """Marks are numbers the host hands out; the device reaches them when told to
    (``reached``); a mark's time is a millisecond per mark in between."""

    def __init__(self) -> None:
        self.next = 0
        self.reached = -1

    def mark(self) -> int:
        self.next += 1
        return self.next

    def seconds_between(self, start: int, end: int) -> float:
        assert end <= self.reached, "read before the device reached it"
        return (end - start) * 1e-3

    def ready(self, mark: int) -> bool:
        return mark <= self.reached


def _plan():
    layers = tuple(LayerProfile(f"b{i}.x", 100, 100, 1.0, 2.0) for i in range(4))
    segments = tuple(SegmentProfile(f"b{i}", 10) for i in range(4))
    plan = plan_swaps(StepProfile(layers, 0, segments=segments), 330, policy="recompute")
    assert plan.recomputed == ("b0",)
    return plan


def _run_pass(costs, plan, clock, *, hooked=False, contended=False, marks_apart=5, forward=0.0):
    timer = costs.begin_pass(KEY, plan, hooked=hooked, contended=contended)
    if timer is not None:
        start = clock.mark()
        clock.next += marks_apart - 1
        timer.record("b0", start)
    costs.pass_ended(KEY, plan, timer, hooked=hooked, forward_seconds=forward)
    return timer


def test_replayed_passes_are_read_once_the_device_reached_them_and_the_last_makes_a_recost_due():
    clock, plan = DeviceClock(), _plan()
    costs = SteadyCosts(clock)
    for _ in range(STEADY_TIMED_PASSES):
        assert _run_pass(costs, plan, clock) is not None
        assert costs.read_arrived() == set()  # the device is behind: nothing is read, nothing waits
        assert costs.timing(KEY) and not costs.recost_due(KEY)
    assert _run_pass(costs, plan, clock) is None  # timed in full: the steady state runs untimed
    clock.reached = clock.next
    assert costs.read_arrived() == {KEY}
    assert costs.recost_due(KEY) and not costs.recost_due(KEY)  # once
    assert not costs.timing(KEY)
    charged = costs.charged(KEY, plan.profile)
    assert charged.segments[0].recompute_seconds == pytest.approx(5e-3)  # 5 marks apart
    assert charged.recompute_cost_ratio == pytest.approx(5e-3 / 1.0)


def test_each_segment_keeps_its_fastest_time_and_a_recost_waits_for_the_last_pass():
    clock, plan = DeviceClock(), _plan()
    costs = SteadyCosts(clock)
    for apart in (40, 3, 9):
        _run_pass(costs, plan, clock, marks_apart=apart)
        clock.reached = clock.next
        read = costs.read_arrived()
        assert read == {KEY} and costs.recost_due(KEY) == (apart == 9)
    assert costs.charged(KEY, plan.profile).segments[0].recompute_seconds == pytest.approx(3e-3)


def test_a_contended_pass_is_not_timed_and_not_counted():
    clock, plan = DeviceClock(), _plan()
    costs = SteadyCosts(clock, passes=1)
    assert _run_pass(costs, plan, clock, contended=True) is None
    assert costs.charged(KEY, plan.profile) is plan.profile
    assert _run_pass(costs, plan, clock) is not None


def test_a_plan_making_other_choices_is_timed_anew_and_one_making_the_same_is_not():
    clock, first, again = DeviceClock(), _plan(), _plan()
    other = plan_swaps(first.profile, 330, policy="swap")
    assert other.recomputed != first.recomputed
    costs = SteadyCosts(clock, passes=1)
    assert _run_pass(costs, first, clock) is not None
    assert _run_pass(costs, first, clock) is None
    assert _run_pass(costs, again, clock) is None  # made again as it was: runs as it ran
    assert costs.begin_pass(KEY, other, hooked=False, contended=False) is None  # nothing recomputed
    assert costs.timing(KEY)  # but timed: its forward
    costs.pass_ended(KEY, other, None, hooked=False, forward_seconds=1.0)
    assert costs.recost_due(KEY)


def test_a_hooked_pass_times_its_backward_less_its_recomputations_and_charges_nothing():
    clock, plan = DeviceClock(), _plan()
    costs = SteadyCosts(clock)
    timer = costs.begin_pass(KEY, plan, hooked=True, contended=True)  # hooked passes always time
    assert timer is not None
    start = clock.mark()
    clock.next += 19
    timer.record("b0", start)
    clock.reached = clock.next
    costs.pass_ended(KEY, plan, timer, hooked=True, forward_seconds=0.5)
    assert costs.plain_backward(KEY, 0.5) == pytest.approx(0.5 - 20e-3)
    assert costs.read_arrived() == set() and costs.charged(KEY, plan.profile) is plan.profile
    assert not costs.timing(KEY) and costs.ratio(KEY, plan.profile) is None


def test_a_failed_pass_forgets_what_was_not_read_and_times_the_plan_again():
    clock, plan = DeviceClock(), _plan()
    costs = SteadyCosts(clock, passes=1)
    _run_pass(costs, plan, clock)
    costs.abandon()
    clock.reached = clock.next
    assert costs.read_arrived() == set() and not costs.timing(KEY)
    assert _run_pass(costs, plan, clock) is not None


def test_a_plan_that_recomputes_nothing_is_not_timed():
    profile = StepProfile((LayerProfile("a", 100, 100, 1.0, 2.0),), 0)
    costs = SteadyCosts(DeviceClock())
    for hooked in (False, True):
        assert costs.begin_pass(KEY, plan_swaps(profile, 10**6), hooked=hooked, contended=False) is None
        assert costs.begin_pass(KEY, None, hooked=hooked, contended=False) is None


def test_the_fastest_forward_after_the_first_replayed_pass_is_charged_and_due_without_recomputation():
    layers = (LayerProfile("a", 100, 100, 4.0, 8.0), LayerProfile("b", 100, 100, 4.0, 2.0))
    plan = plan_swaps(StepProfile(layers, 0), 10**6)
    costs = SteadyCosts(DeviceClock())
    for forward in (1.0, 6.0, 5.0):  # the first may be a pass of the plan before: not counted
        assert costs.begin_pass(KEY, plan, hooked=False, contended=False) is None  # nothing recomputed
        assert not costs.recost_due(KEY)
        costs.pass_ended(KEY, plan, None, hooked=False, forward_seconds=forward)
    assert costs.recost_due(KEY) and not costs.timing(KEY)
    charged = costs.charged(KEY, plan.profile)
    assert [(layer.forward_seconds, layer.backward_seconds) for layer in charged.layers] == [
        (2.5, 8.0),
        (2.5, 2.0),
    ]
    assert costs.charged(KEY, charged) is charged  # never scaled up, nor twice


def test_a_hooked_or_untimed_pass_forward_is_not_charged():
    layers = (LayerProfile("a", 100, 100, 4.0, 8.0),)
    plan = plan_swaps(StepProfile(layers, 0), 10**6)
    costs = SteadyCosts(DeviceClock(), passes=2)
    costs.begin_pass(KEY, plan, hooked=True, contended=False)
    costs.pass_ended(KEY, plan, None, hooked=True, forward_seconds=0.1)
    costs.begin_pass(KEY, plan, hooked=False, contended=True)
    costs.pass_ended(KEY, plan, None, hooked=False, forward_seconds=0.1)
    assert costs.charged(KEY, plan.profile) is plan.profile


def test_a_pass_that_recomputed_nothing_leaves_nothing_to_read():
    """Under a plan that recomputes, a pass whose backward recomputed nothing (no grad, say)
    closes no marks: the plan is timed in full all the same, not waiting forever."""
    clock, plan = DeviceClock(), _plan()
    costs = SteadyCosts(clock, passes=1)
    timer = costs.begin_pass(KEY, plan, hooked=False, contended=False)
    assert timer is not None
    costs.pass_ended(KEY, plan, timer, hooked=False, forward_seconds=0.0)
    assert costs.recost_due(KEY) and not costs.timing(KEY)
