"""The planner may swap a recomputed segment's inputs (its layer in the step the engine sees)
where the profile says the engine may: a plan that does is faster than the best plan keeping
them, names the segment in ``swapped_segments`` and ``swapped_layers`` (what the engine's
schedule swaps), counts their bytes as swapped, and predicts the same peak when its choices are
applied to the profile again (``Plan.peak_bytes_on``). Inputs not measured swappable are never
swapped, nor those of a segment recomputed selectively.
"""

from __future__ import annotations

import pytest

from lightning_accudnn.planner import plan_swaps
from lightning_accudnn.planner.recompute import SegmentSpan, recomputed_profile
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

BLOCKS = 4
INPUT = 40


def _profile(swappable: bool, *, selective: bool = False) -> StepProfile:
    """A stem, four blocks of two 100-byte layers taking 40 bytes each, a head; a slow link."""
    layers = [LayerProfile("stem", INPUT, INPUT, 1.0, 2.0)]
    segments = []
    for k in range(BLOCKS):
        layers += [LayerProfile(f"b{k}.x", 100, 100, 1.0, 2.0), LayerProfile(f"b{k}.y", 100, 100, 1.0, 2.0)]
        segments.append(
            SegmentProfile(
                f"b{k}",
                INPUT,
                INPUT,
                selective_kept_bytes=100 if selective else None,
                selective_recompute_share=0.5,
                selective_recomputed_bytes=100 if selective else None,
                swappable_input_bytes=INPUT if swappable else 0,
                swappable_input_storages=1 if swappable else 0,
            )
        )
    layers.append(LayerProfile("head", 10, 10, 0.5, 1.0))
    return StepProfile(
        tuple(layers), 0, d2h_bytes_per_second=40.0, h2d_bytes_per_second=40.0, segments=tuple(segments)
    )


@pytest.mark.parametrize("cap", [400, 350, 280])
def test_swapping_a_recomputed_segments_inputs_beats_keeping_them(cap):
    profile = _profile(swappable=True)
    plan = plan_swaps(profile, cap)
    kept_inputs = plan_swaps(_profile(swappable=False), cap)
    assert plan.swapped_segments
    assert set(plan.swapped_segments) <= set(plan.recomputed)
    assert plan.swapped_layers >= set(plan.swapped_segments)
    assert plan.predicted_step_seconds < kept_inputs.predicted_step_seconds
    assert plan.predicted_peak_bytes <= cap
    assert plan.peak_bytes_on(profile) == plan.predicted_peak_bytes
    swapped_layers = sum(
        layer.swappable_bytes for layer, s in zip(profile.layers, plan.swap, strict=True) if s
    )
    assert plan.swapped_bytes == swapped_layers + INPUT * len(plan.swapped_segments)
    assert plan.to_dict()["swapped_segments"] == list(plan.swapped_segments)
    assert f"the inputs of {len(plan.swapped_segments)} recomputed segments" in str(plan)


@pytest.mark.parametrize("cap", [400, 350, 300, 280, 250])
def test_inputs_not_measured_swappable_stay_on_the_device(cap):
    assert plan_swaps(_profile(swappable=False), cap).swapped_segments == ()


def test_a_segment_recomputed_selectively_keeps_its_inputs():
    profile = _profile(swappable=True, selective=True)
    whole, selective = (
        SegmentSpan("b0", 1, 2, INPUT, 200, 2.0, swappable_input_bytes=INPUT, swappable_input_storages=1),
        SegmentSpan(
            "b0",
            1,
            2,
            INPUT,
            200,
            2.0,
            selective=True,
            kept_bytes=100,
            swappable_input_bytes=INPUT,
            swappable_input_storages=1,
        ),
    )
    assert recomputed_profile(profile, [whole]).profile.layers[1].swappable_bytes == INPUT
    assert recomputed_profile(profile, [selective]).profile.layers[1].swappable_bytes == 0
    assert recomputed_profile(profile, [whole], swappable=False).profile.layers[1].swappable_bytes == 0
