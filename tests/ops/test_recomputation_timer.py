"""A recomputer with a timer set times each segment's forward run again in backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_accudnn.ops.recompute import SegmentRecomputer
from lightning_accudnn.ops.timing import RecomputationTimer, WallClock
from tests.recompute.models import SlowRecomputation

PAUSE = 0.05


def _model() -> nn.Module:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), SlowRecomputation(PAUSE), nn.Linear(4, 4), nn.Tanh())
    return nn.Sequential(block, nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))


def _step(model: nn.Module, recomputer: SegmentRecomputer) -> None:
    with recomputer.enabled_for_pass():
        loss = model(torch.randn(2, 4)).sum()
    loss.backward()


@pytest.mark.parametrize("selective", [False, True])
def test_each_recomputation_is_timed_whole_or_selective(selective):
    """Both checkpoints end this recomputation early, raising out of it once every save it needs
    is rebuilt: it is timed up to there."""
    model = _model()
    recomputer = SegmentRecomputer()
    recomputer.install(model, ["0"], selective=["0"] if selective else [])
    recomputer.timing = RecomputationTimer(WallClock())
    _step(model, recomputer)
    ((segment, seconds),) = recomputer.timing.take()
    assert segment == "0" and seconds >= PAUSE
    assert recomputer.timing.take() == []
    recomputer.remove()


def test_without_a_timer_nothing_is_timed_and_the_gradients_are_the_same():
    timed, untimed = _model(), _model()
    for model, timing in ((timed, RecomputationTimer(WallClock())), (untimed, None)):
        recomputer = SegmentRecomputer()
        recomputer.install(model, ["0"])
        recomputer.timing = timing
        torch.manual_seed(1)
        _step(model, recomputer)
        recomputer.remove()
    for a, b in zip(timed.parameters(), untimed.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
