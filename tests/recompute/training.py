"""Training helpers for the recompute tests: plain training's record, a profile, a session run."""

from __future__ import annotations

import warnings

import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import StepProfile
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from tests.recompute.models import batch, build, loss_of

#: Profiling, the timed planned passes, the first pass under the plan made from them, two replayed.
STEPS = 4 + TIMED_PLANNED_PASSES


def plain(kind: str, device: str = "cpu", autocast: bool = False) -> list[dict[str, torch.Tensor]]:
    """Per step, the loss, every gradient and (after the optimizer step) every parameter and
    buffer, on ``device`` (under bf16 autocast when ``autocast``)."""
    model = build(kind).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    record = []
    for step in range(STEPS):
        with _autocast(device, autocast):
            loss = loss_of(model, *_batch(kind, step, device))
        loss.backward()
        grads = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        record.append({"loss": loss.detach().clone(), **grads, **state(model)})
    return record


def _batch(kind: str, step: int, device: str) -> tuple[torch.Tensor, ...]:
    return tuple(tensor.to(device) for tensor in batch(kind, step))


def _autocast(device: str, enabled: bool) -> torch.autocast:
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def measured_profile(kind: str, config: OffloadConfig, runtime=None) -> StepProfile:
    """The profile of a planned pass (its layers and segments do not depend on the policy; under
    policy "selective" the segments' selective recomputation is measured too)."""
    return profiled(kind, config, runtime)[0]


def profiled(kind: str, config: OffloadConfig, runtime=None) -> tuple[StepProfile, int]:
    """The profile of a planned pass and the ledger peak of the profiling pass, measured under
    ``config`` with room for everything (policy "recompute", which never swaps, plans fastest,
    or "selective", which measures what recomputing selectively keeps)."""
    policy = "selective" if config.policy == "selective" else "recompute"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config.replace(budget=10**9, policy=policy), "cpu", runtime=runtime)
    model = build(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    peaks = []
    for step in range(2):
        with session.step(model, optimizer):
            loss = loss_of(model, *batch(kind, step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert session.stats is not None
        peaks.append(session.stats.ledger_peak_bytes)
    assert session.plan is not None
    session.close()
    return session.plan.profile, peaks[0]


def train(
    kind: str,
    config: OffloadConfig,
    runtime=None,
    after_step=lambda session: None,
    device: str = "cpu",
    autocast: bool = False,
):
    """:func:`plain`'s steps under a session of ``config`` (on ``device``, under bf16 autocast
    when ``autocast``): the record, and per step the plan, the passes hooked and the peaks."""
    reports: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config, device, runtime=runtime, report=reports.append)
    hooked = []
    attach = session.engine.tracker.attach
    session.engine.tracker.attach = lambda model: (hooked.append(1), attach(model))[1]
    model = build(kind).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    record, plans, hooked_per_step, peaks = [], [], [], []
    for step in range(STEPS):
        before = len(hooked)
        with _autocast(device, autocast), session.step(model, optimizer):
            loss = loss_of(model, *_batch(kind, step, device))
        loss.backward()
        grads = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        record.append({"loss": loss.detach().clone(), **grads, **state(model)})
        plans.append(session.plan)
        hooked_per_step.append(len(hooked) - before)
        peaks.append((session.stats.profiling, session.stats.ledger_peak_bytes))
        after_step(session)
        session.wait_for_plans()  # a plan made on the worker is adopted by the next pass
    session.close()
    assert not any("forward" in vars(module) for module in model.modules())  # wrappers removed
    return record, plans, hooked_per_step, peaks, session
