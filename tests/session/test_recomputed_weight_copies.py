"""Under autocast, the weight copies of a recomputed segment's layers are alive until the
forward ends (autocast's cache holds them) and again while the segment's recomputation and
backward run; in between they are not. Plans count them so, and a step whose backward runs
inside autocast (the cache may hold them all along) counts them all step."""

import functools

import pytest
import torch
from torch import nn

from tests.session.helpers import run_counted

WIDTH, HIDDEN, DEPTH, BATCH = 128, 512, 6, 512


def _mlp_blocks() -> nn.Module:
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)) for _ in range(DEPTH)
    ]
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), *blocks, nn.Linear(WIDTH, WIDTH))


def _inputs(step: int) -> torch.Tensor:
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(step))


def _square_mean(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).float().square().mean()


@functools.cache
def _kept_peak() -> int:
    kept, _ = run_counted(
        _mlp_blocks(),
        _inputs,
        _square_mean,
        3,
        budget="100%",
        reserve_bytes=0,
        min_swap_bytes=0,
        autocast=True,
    )
    return kept[-1].peak


def _recomputing(fraction: float, backward_in_autocast: bool):
    return run_counted(
        _mlp_blocks(),
        _inputs,
        _square_mean,
        4,
        budget=int(fraction * _kept_peak()),
        reserve_bytes=0,
        min_swap_bytes=0,
        policy="recompute",
        autocast=True,
        backward_in_autocast=backward_in_autocast,
    )


@pytest.mark.parametrize("fraction", [0.8, 0.7])
def test_a_recomputed_segment_s_weight_copies_are_counted_where_they_are_alive(fraction):
    """Predicted within 6 % (7.5 and 8.4 % over with the copies counted all step)."""
    seen, plan = _recomputing(fraction, backward_in_autocast=False)
    assert len(plan.recomputed) >= 3
    copies = {layer.name for layer in plan.profile.layers if layer.weight_copy_bytes}
    assert {f"{block}.{linear}" for block in range(1, DEPTH + 1) for linear in (0, 2)} <= copies
    planned = [step for step in seen if step.predicted is not None]
    assert planned and all(step.peak <= step.predicted <= 1.06 * step.peak for step in planned), planned


def test_a_backward_inside_autocast_counts_every_weight_copy_all_step():
    """The step's context is left inside autocast and the backward runs there: the cache may
    hold every copy through the backward, so none is let go from the plan's backward levels."""
    seen, plan = _recomputing(0.8, backward_in_autocast=True)
    assert plan.recomputed
    assert not any(layer.weight_copy_bytes for layer in plan.profile.layers)
    planned = [step for step in seen if step.predicted is not None]
    assert planned and all(step.peak <= step.predicted for step in planned), planned
