"""Train a real model under a recompute plan at the least budget its policy names, beside plain training.

:func:`check_model` trains ``STEPS`` steps of plain PyTorch and the same steps under an
:class:`OffloadSession` at the least budget ``policy`` names (measured from a first run with
room for everything), and checks that gradients, weights and buffers are bitwise equal and
that every pass stayed within the budget.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import Plan

STEPS = 3


@dataclass(frozen=True)
class Workload:
    """A model, its batches and its loss: what the sweep trains."""

    build: Callable[[], nn.Module]
    batch: Callable[[int], Any]  # step -> the model's inputs and targets
    loss: Callable[[nn.Module, Any], torch.Tensor]


@dataclass
class Outcome:
    """What one run under a plan did: the last plan, the budget, every pass's ledger peak and
    the plan each pass ran under (``None`` for the profiling pass; a later pass may run under a
    plan refined from the passes before it)."""

    plan: Plan
    budget: int
    peaks: list[int]
    excluded: tuple[str, ...]
    plans: list[Plan | None]


def _train(
    workload: Workload, session: OffloadSession | None, steps: int = STEPS
) -> tuple[list[dict[str, torch.Tensor]], list[int], list[Plan | None]]:
    torch.manual_seed(0)
    model = workload.build()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    record, peaks = [], []
    plans: list[Plan | None] = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        batch = workload.batch(step)
        if session is None:
            loss = workload.loss(model, batch)
        else:
            with session.step(model, optimizer):
                loss = workload.loss(model, batch)
                plans.append(session.plan if session.stats is not None else None)  # this pass's plan
        loss.backward()
        state = {f"grad:{name}": p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.update({name: t.detach().clone() for name, t in model.state_dict().items()})
        record.append(state)
        if session is not None:
            assert session.stats is not None
            peaks.append(session.stats.ledger_peak_bytes)
    return record, peaks, plans


def _session(config: OffloadConfig) -> OffloadSession:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OffloadSession(config, "cpu")


def plain_record(workload: Workload) -> list[dict[str, torch.Tensor]]:
    """Plain training's record: per step, gradients, then weights and buffers."""
    return _train(workload, None)[0]


def least_recompute_budget(workload: Workload, policy: str = "recompute") -> int:
    """The least budget at which keeping or recomputing (``policy="selective"``: selectively)
    fits, as a session names it."""
    session = _session(OffloadConfig(budget=4 * 10**9, min_swap_bytes=0, reserve_bytes=0, policy=policy))
    _train(workload, session, steps=2)  # the profiling pass, then one planned pass
    session.close()
    assert session.plan is not None
    return session.plan.min_budget_bytes


def check_model(
    workload: Workload, policy: str, budget: int, expected: list[dict[str, torch.Tensor]]
) -> Outcome:
    """Train under ``policy`` at ``budget``: plain training's record bit for bit, every pass
    within the budget."""
    config = OffloadConfig(budget=budget, min_swap_bytes=0, reserve_bytes=0, policy=policy)
    session = _session(config)
    got, peaks, plans = _train(workload, session)
    plan = session.plan
    session.close()
    assert plan is not None
    difference = _equal(got, expected)
    assert difference is None, (policy, difference)
    assert all(peak <= budget for peak in peaks), (policy, peaks, budget)
    return Outcome(plan, budget, peaks, tuple(entry.name for entry in plan.profile.excluded_segments), plans)


def _equal(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]) -> tuple[int, str] | None:
    """The first (step, name) where the records differ in any bit (a NaN equals the same NaN), or ``None``."""
    for step, (have, expected) in enumerate(zip(got, want, strict=True)):
        assert have.keys() == expected.keys(), step
        for name, tensor in expected.items():
            other = have[name]
            if (
                other.dtype != tensor.dtype
                or other.shape != tensor.shape
                or not torch.equal(_bits(other), _bits(tensor))
            ):
                return step, name
    return None


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def sweep(workload: Workload, monkeypatch: Any) -> None:
    """Plain training, then ``policy="recompute"`` and ``policy="auto"`` (a slow host link makes
    recomputing the cheaper choice) at the least budget at which keeping or recomputing fits."""
    from tests.recompute.models import slow_link

    expected = plain_record(workload)
    slow_link(monkeypatch)
    budget = least_recompute_budget(workload)
    for policy in ("recompute", "auto"):
        outcome = check_model(workload, policy, budget, expected)
        if budget < outcome.plan.profile.unconstrained_peak_bytes:  # else the profiling pass's peak binds
            assert outcome.plan.recomputed, (policy, outcome.plan.profile.excluded_segments)
        assert all(entry.reason for entry in outcome.plan.profile.excluded_segments)


def sweep_selective(workload: Workload) -> Outcome:
    """Plain training, then ``policy="selective"`` at the least budget at which keeping or
    recomputing selectively fits: bit for bit, every pass within the budget, and each planned
    pass's ledger peak never above the predicted ledger peak of the plan it ran under."""
    expected = plain_record(workload)
    budget = least_recompute_budget(workload, "selective")
    outcome = check_model(workload, "selective", budget, expected)
    plan = outcome.plan
    if budget < plan.profile.unconstrained_peak_bytes:  # else the profiling pass's peak binds
        assert plan.selective and set(plan.selective) == set(plan.recomputed), plan.recomputed
    for peak, running in zip(outcome.peaks, outcome.plans, strict=True):
        if running is not None:
            assert peak <= running.predicted_ledger_peak_bytes, (outcome.peaks, running)
    return outcome
