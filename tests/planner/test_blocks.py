"""Full per-block checkpointing as a plan: which blocks, what it costs, when it does not fit."""

from __future__ import annotations

import pytest

from lightning_accudnn.planner.blocks import checkpoint_blocks_plan, top_level_blocks
from lightning_accudnn.planner.plan import BudgetTooSmallError
from lightning_accudnn.planner.timeline import unconstrained_seconds
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

MB = 10**6


def stage_profile() -> StepProfile:
    """A stem, two stages of two blocks (each block a conv and a relu), a head: ResNet's names."""
    layers = [LayerProfile("conv1", 4 * MB, 4 * MB, 1e-3, 2e-3)]
    segments = []
    for stage in (1, 2):
        segments.append(SegmentProfile(f"layer{stage}", 4 * MB, 4 * MB))
        for block in (0, 1):
            name = f"layer{stage}.{block}"
            segments.append(SegmentProfile(name, 4 * MB, 4 * MB))
            segments.append(SegmentProfile(f"{name}.downsample", 4 * MB, 4 * MB))
            layers += [
                LayerProfile(f"{name}.conv", 8 * MB, 8 * MB, 2e-3, 4e-3),
                LayerProfile(f"{name}.downsample.0", 8 * MB, 8 * MB, 1e-3, 2e-3),
                LayerProfile(f"{name}.relu", 8 * MB, 8 * MB, 1e-3, 2e-3),
            ]
    layers.append(LayerProfile("fc", MB, MB, 1e-4, 2e-4))
    return StepProfile(tuple(layers), 50 * MB, 5e10, 5e10, segments=tuple(segments))


def test_top_level_blocks_are_the_outermost_indexed_segments() -> None:
    assert top_level_blocks(stage_profile()) == ("layer1.0", "layer1.1", "layer2.0", "layer2.1")


def test_the_plan_recomputes_every_block_and_swaps_nothing() -> None:
    profile = stage_profile()
    plan = checkpoint_blocks_plan(profile, budget_bytes=10**9)
    assert plan.recomputed == ("layer1.0", "layer1.1", "layer2.0", "layer2.1")
    assert plan.swapped_bytes == 0 and not any(plan.swap)
    assert plan.recompute_seconds == pytest.approx(4 * 4e-3)  # each block's forward, again
    assert plan.predicted_step_seconds == pytest.approx(unconstrained_seconds(profile) + 4 * 4e-3)
    assert plan.predicted_peak_bytes < profile.unconstrained_peak_bytes
    assert plan.lower_bound_seconds <= plan.predicted_step_seconds
    assert plan.min_budget_bytes == plan.predicted_peak_bytes


def test_a_budget_below_its_peak_is_refused_with_that_peak() -> None:
    profile = stage_profile()
    peak = checkpoint_blocks_plan(profile, budget_bytes=10**9).predicted_peak_bytes
    assert checkpoint_blocks_plan(profile, budget_bytes=peak).predicted_peak_bytes == peak
    with pytest.raises(BudgetTooSmallError) as caught:
        checkpoint_blocks_plan(profile, budget_bytes=peak - 1, reserve_bytes=0)
    assert caught.value.min_budget_bytes == peak
    with pytest.raises(BudgetTooSmallError) as caught:
        checkpoint_blocks_plan(profile, budget_bytes=peak, reserve_bytes=MB)
    assert caught.value.min_budget_bytes == peak + MB


def test_named_blocks_and_unknown_names() -> None:
    profile = stage_profile()
    plan = checkpoint_blocks_plan(profile, budget_bytes=10**9, blocks=["layer1", "layer2"])
    assert plan.recomputed == ("layer1", "layer2")
    with pytest.raises(ValueError, match="layer3.0"):
        checkpoint_blocks_plan(profile, budget_bytes=10**9, blocks=["layer3.0"])
    flat = StepProfile((LayerProfile("a", MB, MB),), 0)
    with pytest.raises(ValueError, match="no top-level blocks"):
        checkpoint_blocks_plan(flat, budget_bytes=10**9)
