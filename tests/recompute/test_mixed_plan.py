"""A plan that recomputes one segment whole and another selectively runs as planned.

Policy ``"auto"`` chooses per segment between keeping it, recomputing it whole and (where the
profiling pass measured it) recomputing it selectively. A model of blocks where only the
later ones have cheap ops to recompute selectively (the first is two linear layers: selective
recomputation would keep everything it saves) gets, at a budget where the first is not enough,
it whole and a later one selectively. Training under that plan equals plain training in
every bit, and every pass's ledger peak lies within the plan's prediction (never below it, the
activation part at most 10 % above it).

The session runs policy ``"auto"`` (its profiling passes measure selective recomputation),
with its planner given a host link too slow for swapping to pay (on CPU the copies cost less
than this model's compute, and auto would swap instead of recomputing).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadSession
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.planner.plan import BudgetTooSmallError, Plan
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.session import planning as planning_module
from tests.recompute.recorded_training import assert_bitwise_equal, cpu_session, train_recorded

#: The activation part of a prediction is at most this much above the ledger's.
TOLERANCE = 1.10
STEPS = 4


class _CheapOps(nn.Module):
    """A narrow linear layer, then cheap ops on a wide tensor (GELU, dropout, a residual add,
    LayerNorm): selective recomputation frees most of what it saves."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up = nn.Linear(width, width)
        self.drop = nn.Dropout(0.25)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu(self.up(x))
        return self.norm(x + self.drop(torch.tanh(y) * y))


def _model() -> nn.Module:
    torch.manual_seed(0)
    width = 64
    return nn.Sequential(
        nn.Sequential(nn.Linear(width, 4 * width), nn.Linear(4 * width, width)),  # only matmuls
        _CheapOps(width),
        _CheapOps(width),
        nn.Linear(width, 1),
    )


def _batch(step: int) -> torch.Tensor:
    return torch.randn(256, 64, generator=torch.Generator().manual_seed(step))


def _train(
    model: nn.Module, session: OffloadSession | None
) -> tuple[list[dict[str, torch.Tensor]], list[tuple[Plan | None, int]]]:
    return train_recorded(model, session, _batch, STEPS)


def _session(budget: int) -> OffloadSession:
    return cpu_session(budget, policy="auto")


def _slow_link(profile: StepProfile) -> StepProfile:
    return dataclasses.replace(profile, d2h_bytes_per_second=1.0, h2d_bytes_per_second=1.0)


def _mixed_budget(profile: StepProfile) -> int:
    """The middle of the budgets (in steps of 8 % of the activations) whose auto plan mixes
    whole and selective recomputation (the middle: a re-measured profile's timings differ)."""
    activations = profile.unconstrained_peak_bytes - profile.static_bytes
    mixed = []
    for percent in range(88, 0, -8):
        budget = profile.static_bytes + activations * percent // 100
        try:
            plan = planner_plan.plan_swaps(_slow_link(profile), budget, policy="auto")
        except BudgetTooSmallError:
            break
        if plan.selective and set(plan.recomputed) - set(plan.selective):
            mixed.append(budget)
    assert mixed, "no budget gives a plan mixing whole and selective recomputation"
    return mixed[len(mixed) // 2]


def test_a_plan_mixing_whole_and_selective_recomputation_trains_bitwise_within_its_prediction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profiling = _session(10**9)
    _train(_model(), profiling)
    assert profiling.plan is not None
    profile = profiling.plan.profile
    profiling.close()
    measured = {segment.name for segment in profile.segments if segment.selective_kept_bytes is not None}
    assert {"0", "1", "2"} <= measured
    budget = _mixed_budget(profile)

    real = planner_plan.plan_swaps

    def slow_link(profile: StepProfile, *args: object, **kwargs: object) -> Plan:
        assert kwargs["policy"] == "auto"
        return real(_slow_link(profile), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planning_module, "plan_swaps", slow_link)
    model = _model()
    expected, _ = _train(copy.deepcopy(model), None)
    session = _session(budget)
    record, peaks = _train(model, session)
    session.close()
    assert_bitwise_equal(record, expected)
    checked, mixed = 0, 0
    for plan, ledger in peaks:
        if plan is None:
            continue
        assert plan.policy == "auto" and plan.recomputed, plan
        mixed += bool(plan.selective and set(plan.recomputed) - set(plan.selective))
        static = plan.profile.static_bytes
        predicted = plan.predicted_ledger_peak_bytes
        assert ledger <= predicted <= plan.predicted_peak_bytes <= budget, (ledger, predicted)
        assert predicted - static <= TOLERANCE * (ledger - static), (ledger, predicted, static)
        checked += 1
    assert checked >= 2 and mixed >= 1, peaks
