"""Nested recomputation: a stage recomputed with its blocks recomputed again inside it.

Its time counts the inner forwards twice, its transient follows its backward, a plan that
nests predicts its own peak again from its names, and where one level of recomputation cannot
reach a budget the search nests (never below the lower bound).
"""

from __future__ import annotations

import pytest

from lightning_accudnn.planner.plan import lower_bound_seconds, min_budget_bytes, plan_swaps
from lightning_accudnn.planner.recompute import (
    SegmentSpan,
    named_spans,
    nested_span,
    policy_spans,
    recomputed_profile,
    set_key,
)
from lightning_accudnn.planner.search import nested_spans
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

STAGES, BLOCKS, PARTS = 2, 4, 3


def _staged() -> StepProfile:
    """Stages of blocks of three layers (100 bytes each, resident), block inputs of 40 bytes."""
    layers = [LayerProfile("stem", 40, 40, 0.5, 1.0)]
    segments = []
    for s in range(STAGES):
        segments.append(SegmentProfile(f"s{s}", 40))
        for b in range(BLOCKS):
            segments.append(SegmentProfile(f"s{s}.b{b}", 40))
            layers += [LayerProfile(f"s{s}.b{b}.l{p}", 100, 100, 1.0, 2.0) for p in range(PARTS)]
    layers.append(LayerProfile("head", 10, 10, 0.1, 0.2))
    return StepProfile(tuple(layers), static_bytes=1000, segments=tuple(segments))


def _span(profile: StepProfile, name: str) -> SegmentSpan:
    (span,) = (span for span in policy_spans(profile, "recompute") if span.name == name)
    return span


def test_a_nested_span_costs_the_inner_forwards_twice_and_frees_what_its_outer_frees():
    profile = _staged()
    outer = _span(profile, "s0")
    inner = [_span(profile, f"s0.b{b}") for b in range(BLOCKS)]
    saved = [layer.saved_bytes for layer in profile.layers]
    span = nested_span(outer, inner, saved)
    assert span.names == ("s0", "s0.b0", "s0.b1", "s0.b2", "s0.b3")
    assert span.recompute_seconds == pytest.approx(2 * BLOCKS * PARTS * 1.0)
    assert span.freed_bytes == outer.freed_bytes
    assert span.held_bytes == outer.held_bytes
    # The last block's backward: every block's input rebuilt, and that block's saves.
    assert span.transient_bytes == BLOCKS * 40 + PARTS * 100
    assert set_key([span]) != set_key([outer])
    step = recomputed_profile(profile, [span])
    (g,) = (g for g, layer in enumerate(step.profile.layers) if layer.name == "s0")
    assert step.transient_bytes[g] == span.transient_bytes
    assert step.profile.layers[g].backward_seconds == pytest.approx(BLOCKS * PARTS * (2.0 + 2 * 1.0))
    assert step.recomputed == span.names
    assert step.recompute_seconds == pytest.approx(span.recompute_seconds)


def test_a_nested_span_counts_what_lies_outside_its_blocks_up_to_each_block():
    outer = SegmentSpan("s", 0, 4, 10, 500, 5.0)
    first = SegmentSpan("s.a", 1, 2, 30, 200, 2.0)
    second = SegmentSpan("s.b", 3, 4, 20, 150, 2.0)
    # Rebuilt: layer 0 (100) and the inputs 30 and 20: 150 in all; the first block's backward
    # holds 100 + 30 + its 200, the second's everything rebuilt and its 150.
    span = nested_span(outer, [second, first], [100, 100, 100, 75, 75])
    assert span.inner == (first, second)
    assert span.transient_bytes == max(150, 100 + 30 + 200, 150 + 150)


@pytest.mark.parametrize(
    "inner",
    [
        [SegmentSpan("s.a", 0, 1, 10, 100, 1.0, selective=True)],
        [SegmentSpan("s", 0, 3, 10, 100, 1.0)],
        [SegmentSpan("s.a", 0, 1, 10, 100, 1.0), SegmentSpan("s.a.x", 1, 1, 10, 50, 1.0)],
        [SegmentSpan("t", 3, 4, 10, 100, 1.0)],
        [],
    ],
)
def test_only_whole_disjoint_segments_strictly_inside_nest(inner):
    with pytest.raises(ValueError):
        nested_span(SegmentSpan("s", 0, 3, 10, 400, 4.0), inner, [100] * 5)


def test_the_names_of_a_nested_plan_give_its_spans_again():
    profile = _staged()
    (nested,) = (
        span for span in nested_spans(profile, policy_spans(profile, "recompute")) if span.name == "s1"
    )
    spans = named_spans(profile, "recompute", [*nested.names, "s0.b1"])
    assert [span.names for span in spans] == [("s0.b1",), nested.names]
    assert spans[1] == nested


def test_where_one_level_cannot_reach_the_budget_the_plan_nests_within_its_prediction_and_bound():
    profile = _staged()
    spans = policy_spans(profile, "recompute")
    smallest = min_budget_bytes(profile, policy="recompute")
    blocks = [span for span in spans if span.name.count(".") == 1]
    stages = [span for span in spans if "." not in span.name]
    for chosen in (blocks, stages):  # each level alone needs more
        step = recomputed_profile(profile, chosen, swappable=False)
        nothing_swapped = PlanChoice((False,) * len(step.profile.layers), 0, 0)
        assert Simulator(step.profile, step.transient_bytes).peak_bytes(nothing_swapped) > smallest
    plan = plan_swaps(profile, smallest, policy="recompute")
    assert plan.predicted_peak_bytes <= smallest
    recomputed = set(plan.recomputed)
    assert any(f"{stage.name}.b0" in recomputed for stage in stages if stage.name in recomputed), recomputed
    assert plan.peak_bytes_on(profile) == plan.predicted_peak_bytes
    assert lower_bound_seconds(profile, smallest, "recompute") <= plan.predicted_step_seconds * (1 + 1e-9)
