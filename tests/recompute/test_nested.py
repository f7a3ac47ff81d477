"""A plan that recomputes a stage and the blocks inside it (two-level checkpointing) runs as planned.

A model of stages of wide blocks: recomputing the blocks holds every block's input, recomputing
the stages rebuilds a whole stage's saves in backward; recomputing a stage with its blocks
recomputed again inside it holds only the stage's input in forward and, in the stage's backward,
its blocks' inputs and one block's saves. At the smallest budget of policy ``"recompute"`` the
plan nests. Training under it equals plain training in every bit (dropout, BatchNorm), and every
pass's ledger peak lies within the plan's prediction (never below it, the activation part at most
10 % above it).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from lightning_accudnn import OffloadSession
from lightning_accudnn.planner.plan import Plan, min_budget_bytes
from lightning_accudnn.profile import StepProfile
from tests.recompute.recorded_training import assert_bitwise_equal, cpu_session, train_recorded

#: The activation part of a prediction is at most this much above the ledger's.
TOLERANCE = 1.10
STEPS = 4
WIDTH = 32
STAGES, BLOCKS = 2, 4


class _Block(nn.Module):
    """A residual block that saves much more than its input: a wide hidden layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 8 * width)
        self.norm = nn.BatchNorm1d(8 * width)
        self.drop = nn.Dropout(0.25)
        self.down = nn.Linear(8 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.drop(torch.relu(self.norm(self.up(x)))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    stages = [nn.Sequential(*(_Block(WIDTH) for _ in range(BLOCKS))) for _ in range(STAGES)]
    return nn.Sequential(*stages, nn.Linear(WIDTH, 1))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(128, WIDTH, generator=torch.Generator().manual_seed(step))


def _train(
    model: nn.Module, session: OffloadSession | None
) -> tuple[list[dict[str, torch.Tensor]], list[tuple[Plan | None, int]]]:
    return train_recorded(model, session, _batch, STEPS)


def _session(budget: int) -> OffloadSession:
    return cpu_session(budget, policy="recompute")


def _nested(plan: Plan) -> set[str]:
    """The recomputed stages whose blocks are recomputed too."""
    recomputed = set(plan.recomputed)
    return {
        name
        for name in recomputed
        if "." not in name and any(other.startswith(name + ".") for other in recomputed)
    }


def _profile() -> StepProfile:
    session = _session(10**9)
    _train(_model(), session)
    assert session.plan is not None
    profile = session.plan.profile
    session.close()
    return profile


def test_a_plan_recomputing_a_stage_and_its_blocks_trains_bitwise_within_its_prediction() -> None:
    profile = _profile()
    names = {segment.name for segment in profile.segments}
    assert {"0", "1", "0.0", "1.3"} <= names, names
    budget = min_budget_bytes(profile, policy="recompute")
    model = _model()
    expected, _ = _train(copy.deepcopy(model), None)
    session = _session(budget)
    record, peaks = _train(model, session)
    session.close()
    assert_bitwise_equal(record, expected)
    checked = 0
    for plan, ledger in peaks:
        if plan is None:
            continue
        assert _nested(plan), plan.recomputed  # one level cannot reach this budget
        static = plan.profile.static_bytes
        predicted = plan.predicted_ledger_peak_bytes
        assert ledger <= predicted <= plan.predicted_peak_bytes <= budget, (ledger, predicted)
        assert predicted - static <= TOLERANCE * (ledger - static), (ledger, predicted, static)
        checked += 1
    assert checked >= 2, peaks
