"""The profile's recomputation cost ratio: what running a segment's forward again in backward
takes, over the forward time of its layers, charged by every plan, bound and report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightning_accudnn.planner.plan import plan_swaps
from lightning_accudnn.planner.recompute import candidate_spans
from lightning_accudnn.planner.scaling import ShapeRatio, scale_profile
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
from tests.planner.test_recompute import GB, _blocks


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("inf"), float("nan")])
def test_a_ratio_that_is_not_positive_and_finite_is_refused(ratio):
    with pytest.raises(ValueError, match="recompute_cost_ratio must be positive and finite"):
        StepProfile((LayerProfile("a", 1, 1),), 0, recompute_cost_ratio=ratio)


def test_the_same_recomputation_costs_the_ratio_times_its_forward():
    profile = _blocks(4, link=2 * GB)
    budget = profile.static_bytes + profile.saved_bytes // 2
    plain = plan_swaps(profile, budget, policy="recompute")
    costly = plan_swaps(replace(profile, recompute_cost_ratio=3.0), budget, policy="recompute")
    assert plain.recomputed and costly.recomputed == plain.recomputed
    assert costly.recompute_seconds == pytest.approx(3.0 * plain.recompute_seconds)
    assert costly.predicted_step_seconds == pytest.approx(
        plain.predicted_step_seconds + 2.0 * plain.recompute_seconds
    )
    assert costly.lower_bound_seconds <= costly.predicted_step_seconds
    assert "recomputing measured at 3.00x the forward it repeats" in str(costly)
    assert "measured at" not in str(plain)
    assert costly.to_dict()["recompute_cost_ratio"] == 3.0


def test_selective_and_nested_spans_take_the_ratio_once_each():
    layers = tuple(LayerProfile(f"s.b{i}.{part}", 100, 100, 1.0, 2.0) for i in range(2) for part in "xy")
    segments = (
        SegmentProfile("s", 10),
        SegmentProfile("s.b0", 10, selective_kept_bytes=20, selective_recompute_share=0.25),
        SegmentProfile("s.b1", 10),
    )
    profile = StepProfile(layers, 0, segments=segments, recompute_cost_ratio=2.0)
    whole = {span.name: span.recompute_seconds for span in candidate_spans(profile)}
    selective = {span.name: span.recompute_seconds for span in candidate_spans(profile, selective=True)}
    assert whole == {"s": 8.0, "s.b0": 4.0, "s.b1": 4.0}
    assert selective == {"s.b0": 1.0}


def test_a_costly_recomputation_is_traded_for_copies():
    """Recomputing a block's 1 ms forward beats copying 1 GB at 2 GB/s; at 1000 times the cost it
    does not, and the plan swaps what it recomputed."""
    profile = _blocks(6, link=2 * GB)
    budget = profile.static_bytes + profile.saved_bytes // 3
    cheap = plan_swaps(profile, budget, policy="auto")
    costly = plan_swaps(replace(profile, recompute_cost_ratio=1000.0), budget, policy="auto")
    assert len(cheap.recomputed) == 4 and not costly.recomputed
    assert costly.swapped_bytes > cheap.swapped_bytes
    assert costly.predicted_step_seconds > cheap.predicted_step_seconds


def test_a_timed_segment_is_charged_what_its_recomputation_took_the_others_the_ratio():
    layers = tuple(LayerProfile(f"s.b{i}.{part}", 100, 100, 1.0, 2.0) for i in range(2) for part in "xy")
    segments = (
        SegmentProfile("s", 10),
        SegmentProfile(
            "s.b0", 10, recompute_seconds=7.0, selective_kept_bytes=20, selective_recompute_share=0.25
        ),
        SegmentProfile("s.b1", 10, selective_recompute_seconds=0.1),
    )
    profile = StepProfile(layers, 0, segments=segments, recompute_cost_ratio=2.0)
    whole = {span.name: span.recompute_seconds for span in candidate_spans(profile)}
    selective = {span.name: span.recompute_seconds for span in candidate_spans(profile, selective=True)}
    assert whole == {"s": 8.0, "s.b0": 7.0, "s.b1": 4.0}  # s.b1 was timed selectively only
    assert selective == {"s.b0": 1.0}  # s.b1's selective recomputation was never measured


def test_the_plan_recomputes_the_segment_timed_cheapest():
    """Four blocks of 100 bytes (2 s of forward each); at 320 bytes recomputing one of the first
    three fits. Timed, b0 took 7 s and b2 0.5 s; b1, untimed, is charged twice its forward."""
    layers = tuple(LayerProfile(f"b{i}.{part}", 50, 50, 1.0, 2.0) for i in range(4) for part in "xy")
    timed = {"b0": 7.0, "b2": 0.5}
    segments = tuple(SegmentProfile(f"b{i}", 10, recompute_seconds=timed.get(f"b{i}")) for i in range(4))
    profile = StepProfile(layers, 0, segments=segments, recompute_cost_ratio=2.0)
    plan = plan_swaps(profile, 320, policy="recompute")
    assert plan.recomputed == ("b2",) and plan.recompute_seconds == 0.5
    untimed = plan_swaps(
        replace(profile, segments=tuple(SegmentProfile(f"b{i}", 10) for i in range(4))),
        320,
        policy="recompute",
    )
    assert untimed.recompute_seconds == 4.0


def test_a_negative_or_infinite_measured_recomputation_is_refused():
    for seconds in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="measured seconds must be finite"):
            SegmentProfile("b", 10, recompute_seconds=seconds)


def test_a_profile_scaled_to_another_batch_charges_its_segments_by_the_ratio():
    layers = (LayerProfile("b.x", 100, 100, 1.0, 2.0),)
    segment = SegmentProfile("b", 10, recompute_seconds=5.0, selective_recompute_seconds=1.0)
    profile = StepProfile(layers, 0, segments=(segment,), recompute_cost_ratio=3.0)
    scaled = scale_profile(profile, ShapeRatio(batch=2.0))
    (grown,) = scaled.segments
    assert grown.recompute_seconds is None and grown.selective_recompute_seconds is None
    assert scaled.recompute_cost_ratio == 3.0
