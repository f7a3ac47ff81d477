"""The profile's recomputation cost ratio: what running a segment's forward again in backward
takes, over the forward time of its layers, charged by every plan, bound and report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightning_accudnn.planner.plan import plan_swaps
from lightning_accudnn.planner.recompute import candidate_spans
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
