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
    """What one run under a plan did: the last plan, the budget and every pass's ledger peak."""

    plan: Plan
    budget: int
    peaks: list[int]
    excluded: tuple[str, ...]


def _train(workload: Workload, session: OffloadSession | None) -> tuple[list[dict[str, torch.Tensor]], list[int]]:
    torch.manual_seed(0)
    model = workload.build()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    record, peaks = [], []
    for step in range(STEPS):
        torch.manual_seed(100 + step)
        batch = workload.batch(step)
        if session is None:
            loss = workload.loss(model, batch)
        else:
            with session.step(model, optimizer):
                loss = workload.loss(model, batch)
        loss.backward()
        state = {f"grad:{name}": p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.update({name: t.detach().clone() for name, t in model.state_dict().items()})
        record.append(state)
        if session is not None:
            assert session.stats is not None
            peaks.append(session.stats.ledger_peak_bytes)
    return record, peaks


def _session(config: OffloadConfig) -> OffloadSession:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OffloadSession(config, "cpu")


def check_model(workload: Workload, policy: str, expected: list[dict[str, torch.Tensor]] | None = None) -> Outcome:
    """Train under ``policy`` at the least budget it names; bitwise plain training (``expected``,
    or measured here), every pass within the budget. Returns what the planned run did."""
    if expected is None:
        expected, _ = _train(workload, None)
    config = OffloadConfig(budget=4 * 10**9, min_swap_bytes=0, reserve_bytes=0, policy=policy)
    roomy = _session(config)
    _train(workload, roomy)
    assert roomy.plan is not None
    roomy.close()
    budget = roomy.plan.min_budget_bytes
    session = _session(config.replace(budget=budget))
    got, peaks = _train(workload, session)
    plan = session.plan
    session.close()
    assert plan is not None
    for step, (have, want) in enumerate(zip(got, expected, strict=True)):
        assert have.keys() == want.keys(), step
        for name in want:
            assert torch.equal(have[name], want[name]), (policy, step, name)
    assert all(peak <= budget for peak in peaks), (policy, peaks, budget)
    return Outcome(plan, budget, peaks, tuple(entry.name for entry in plan.profile.excluded_segments))
