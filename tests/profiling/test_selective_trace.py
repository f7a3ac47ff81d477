"""The dry-run trace measures selective recomputation as the probe of a live run does."""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.planner.plan import min_budget_bytes, plan_swaps
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step

ROWS, WIDTH = 256, 64


class _Block(nn.Module):
    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        self.act = nn.Hardswish(inplace=True) if inplace else nn.GELU()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(self.act(self.up(x))))


def _trace(inplace: bool = False):
    def build() -> nn.Module:
        return nn.Sequential(_Block(inplace), _Block(inplace), nn.Linear(WIDTH, 1))

    return trace_step(build, (ROWS, WIDTH), tracker=LayerTracker())


def test_the_trace_measures_what_selective_recomputation_keeps_and_rebuilds():
    trace = _trace()
    profile = trace.to_profile(get_gpu("h100"), optimizer="sgd", min_swap_bytes=0)
    segments = {segment.name: segment for segment in profile.segments}
    assert set(segments) == {"0", "1"}
    for segment in segments.values():
        # The two linear layers' outputs (float32), kept.
        assert segment.selective_kept_bytes == ROWS * (4 * WIDTH + WIDTH) * 4
        # GELU's output (saved by the second linear layer) and dropout's bool mask, rebuilt (GELU's
        # input, the first linear layer's output, is kept).
        assert segment.selective_recomputed_bytes == ROWS * 4 * WIDTH * 4 + ROWS * WIDTH
        assert 0.0 < segment.selective_recompute_share < 1.0
    budget = min_budget_bytes(profile, policy="selective")
    assert budget < profile.unconstrained_peak_bytes
    plan = plan_swaps(profile, budget, policy="selective")
    assert plan.selective and plan.recompute_seconds < sum(
        layer.forward_seconds for layer in profile.layers if layer.name[0] in "01"
    )


def test_a_kept_output_written_in_place_is_not_measured_for_selective_recomputation():
    """An in-place Hardswish writes into the first linear layer's output: a selective replay would
    read the written values, so neither block is a selective candidate."""
    segments = _trace(inplace=True).segments
    assert [segment.selective_kept_bytes for segment in segments] == [None, None]
