"""Training with recomputed segments is training: bitwise-equal gradients, weights and buffers."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner.plan import min_budget_bytes
from lightning_accudnn.testing import SimulatedGPU
from tests.recompute.models import batch, build, loss_of

STEPS = 5


def _plain(kind: str) -> list[dict[str, torch.Tensor]]:
    """Per step, every gradient and (after the optimizer step) every parameter and buffer."""
    model = build(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    record = []
    for step in range(STEPS):
        loss_of(model, *batch(kind, step)).backward()
        grads = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        record.append({**grads, **_state(model)})
    return record


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _profile(kind: str, config: OffloadConfig, runtime=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config.replace(budget=10**9), "cpu", runtime=runtime)
    model = build(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        with session.step(model, optimizer):
            loss = loss_of(model, *batch(kind, step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert session.plan is not None
    session.close()
    return session.plan.profile


def _train(kind: str, config: OffloadConfig, runtime=None, after_step=lambda session: None):
    reports: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config, "cpu", runtime=runtime, report=reports.append)
    hooked = []
    attach = session.engine.tracker.attach
    session.engine.tracker.attach = lambda model: (hooked.append(1), attach(model))[1]
    model = build(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    record, plans, hooked_per_step, peaks = [], [], [], []
    for step in range(STEPS):
        before = len(hooked)
        with session.step(model, optimizer):
            loss = loss_of(model, *batch(kind, step))
        loss.backward()
        grads = {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        record.append({**grads, **_state(model)})
        plans.append(session.plan)
        hooked_per_step.append(len(hooked) - before)
        peaks.append((session.stats.profiling, session.stats.ledger_peak_bytes))
        after_step(session)
    session.close()
    assert not any("forward" in vars(module) for module in model.modules())  # wrappers removed
    return record, plans, hooked_per_step, peaks, session


CASES = [
    ("resnet", "recompute", 0),
    ("resnet", "auto", 2**40),  # nothing swappable: auto can only recompute
    ("gpt", "recompute", 0),
    ("gpt", "auto", 2**40),
    ("checkpointed", "recompute", 0),
    ("checkpointed", "auto", 2**40),
]


@pytest.mark.parametrize(("kind", "policy", "min_swap_bytes"), CASES)
def test_recomputed_training_is_bitwise_plain_training(kind, policy, min_swap_bytes):
    config = OffloadConfig(budget=10**9, min_swap_bytes=min_swap_bytes, reserve_bytes=0, policy=policy)
    profile = _profile(kind, config)
    budget = min_budget_bytes(profile, policy=policy)
    assert budget < profile.unconstrained_peak_bytes  # only recomputation makes it fit
    expected = _plain(kind)
    record, plans, hooked, peaks, _ = _train(kind, config.replace(budget=budget))
    for step, (got, want) in enumerate(zip(record, expected, strict=True)):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (kind, policy, step, name)
    final = plans[-1]
    assert final is not None and final.recomputed
    # Within the budget: the engine's ledger in every planned pass.
    for profiling, peak in peaks:
        if not profiling:
            assert peak <= budget, (peak, budget)
    # Once the plan is made and its sequence recorded, no more hooked (profiling) passes.
    assert hooked[-2:] == [0, 0], hooked
    assert all(plan is final for plan in plans[-2:])


def test_a_user_checkpointed_block_is_never_recomputed_again():
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="recompute")
    profile = _profile("checkpointed", config)
    names = {segment.name for segment in profile.segments}
    assert "checkpointed" not in names and not any(name.startswith("checkpointed.") for name in names)
    assert {"stem", "plain.0", "plain.1"} <= names


@pytest.mark.parametrize("lag", [0, 2, None])
def test_recomputation_on_a_simulated_gpu_keeps_order_and_the_budget(lag):
    # On this small ResNet swapping everything reaches as low a peak as recomputing does: with
    # nothing swappable (every storage below min_swap_bytes) only recomputation lowers it.
    config = OffloadConfig(budget=10**9, min_swap_bytes=2**40, reserve_bytes=0, policy="auto")
    profile = _profile("resnet", config, runtime=SimulatedGPU(lag=lag))
    budget = (min_budget_bytes(profile, policy="auto") + min_budget_bytes(profile, policy="swap")) // 2
    assert budget < min_budget_bytes(profile, policy="swap")  # swapping alone cannot fit
    gpu = SimulatedGPU(lag=lag)
    expected = _plain("resnet")
    # The profiling pass runs before any plan (here it can swap nothing): the planned passes' peak counts.
    record, plans, _, peaks, _ = _train(
        "resnet",
        config.replace(budget=budget),
        runtime=gpu,
        after_step=lambda session: gpu.reset_peaks() if session.stats.profiling else None,
    )
    for got, want in zip(record, expected, strict=True):
        assert all(torch.equal(got[name], want[name]) for name in want)
    assert plans[-1].recomputed
    assert gpu.violations == []
    assert all(peak <= budget for profiling, peak in peaks if not profiling)
    assert gpu.peak_held_bytes <= budget
