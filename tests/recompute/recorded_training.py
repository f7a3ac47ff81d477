"""Train a small model with and without a session, recording every step, to compare bit for bit."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner.plan import Plan


def train_recorded(
    model: nn.Module, session: OffloadSession | None, batch: Callable[[int], torch.Tensor], steps: int
) -> tuple[list[dict[str, torch.Tensor]], list[tuple[Plan | None, int]]]:
    """``steps`` SGD steps of ``model`` on ``batch(step)`` (mean squared output), under
    ``session`` when given. Per step: the gradients, parameters and buffers after it; and, under a
    session, the plan each pass ran under (``None`` when profiling) with its ledger peak."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    record, peaks = [], []
    for step in range(steps):
        if session is None:
            loss = model(batch(step)).square().mean()
        else:
            with session.step(model, optimizer):
                loss = model(batch(step)).square().mean()
                running = session.plan if session.stats is not None else None
        loss.backward()
        grads = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        record.append({**grads, **{n: t.detach().clone() for n, t in model.state_dict().items()}})
        if session is not None:
            assert session.stats is not None
            assert (running is None) == session.stats.profiling
            peaks.append((running, session.stats.ledger_peak_bytes))
    return record, peaks


def assert_bitwise_equal(
    record: list[dict[str, torch.Tensor]], expected: list[dict[str, torch.Tensor]]
) -> None:
    """Every step's recorded tensors equal the expected ones in every bit."""
    for step, (got, want) in enumerate(zip(record, expected, strict=True)):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (step, name)


def cpu_session(budget: int, policy: str) -> OffloadSession:
    """A session on the CPU at ``budget`` (every tensor may swap, no reserve) under ``policy``,
    without the warning that no memory is saved there."""
    config = OffloadConfig(budget=budget, min_swap_bytes=0, reserve_bytes=0, policy=policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return OffloadSession(config, "cpu")
