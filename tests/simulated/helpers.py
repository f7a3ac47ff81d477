"""Train a model with and without the engine on a simulated GPU and compare, bit for bit."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession, OffloadStats
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.planner import Plan
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.testing import SimulatedGPU

Loss = Callable[[nn.Module, object], torch.Tensor]


@dataclass
class SimulatedRun:
    gpu: SimulatedGPU
    ledger_peaks: list[int]
    held_peaks: list[int]


def grads_of(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def train_plain(
    model: nn.Module, batches: Sequence[object], loss_fn: Loss
) -> list[list[torch.Tensor | None]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grads = []
    for batch in batches:
        optimizer.zero_grad()
        loss_fn(model, batch).backward()
        grads.append(grads_of(model))
        optimizer.step()
    return grads


def train_simulated(
    model: nn.Module,
    batches: Sequence[object],
    loss_fn: Loss,
    schedule: SwapSchedule,
    gpu: SimulatedGPU,
    engine_type: type[OffloadEngine] = OffloadEngine,
) -> tuple[list[list[torch.Tensor | None]], SimulatedRun]:
    """Train under ``gpu``; after each step the host pool and the ledger are back to zero."""
    engine = engine_type(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grads, run = [], SimulatedRun(gpu, [], [])
    for batch in batches:
        optimizer.zero_grad()
        gpu.reset_peaks()
        with engine.offload(model, schedule):
            loss = loss_fn(model, batch)
        loss.backward()
        del loss
        stats = engine.end_step()
        assert stats is not None
        run.ledger_peaks.append(stats.ledger_peak_bytes)
        run.held_peaks.append(gpu.peak_held_bytes)
        assert engine.pool.in_use_bytes == 0, "host buffers still in use after the step"
        assert engine.ledger.activation_bytes == 0, "device bytes still counted after the step"
        assert gpu.held_bytes == 0, "device blocks still held after the step"
        grads.append(grads_of(model))
        optimizer.step()
    engine.close()
    gpu.synchronize()
    return grads, run


@contextlib.contextmanager
def planner_search_replaced(search: Callable[..., object]) -> Iterator[None]:
    """The planner's search (``search_mixed``, as :func:`~lightning_accudnn.planner.plan_swaps`
    calls it) replaced by ``search`` inside: a plan forced whatever the timings."""
    original = planner_plan.search_mixed
    planner_plan.search_mixed = search  # type: ignore[assignment]
    try:
        yield
    finally:
        planner_plan.search_mixed = original


@dataclass
class PlannedStep:
    """A session's step on a simulated GPU: its figures, the plan it ran and the most the GPU held."""

    stats: OffloadStats
    plan: Plan
    peak_held_bytes: int


def train_session_simulated(
    model: nn.Module, batches: Sequence[object], loss_fn: Loss, gpu: SimulatedGPU, config: OffloadConfig
) -> tuple[list[list[torch.Tensor | None]], list[PlannedStep]]:
    """Train under an :class:`~lightning_accudnn.OffloadSession` of ``config`` on ``gpu``: the
    gradients and the steps. After each step the host pool is empty; after the last, no stream
    ordering was violated."""
    session = OffloadSession(config, torch.device("cpu"), runtime=gpu)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grads, steps = [], []
    for batch in batches:
        optimizer.zero_grad()
        gpu.reset_peaks()
        with session.step(model, optimizer, batch=batch):
            loss = loss_fn(model, batch)
        loss.backward()
        del loss
        stats, plan = session.stats, session.plan
        assert stats is not None and plan is not None
        steps.append(PlannedStep(stats, plan, gpu.peak_held_bytes))
        assert session.engine.pool.in_use_bytes == 0, "host buffers still in use after the step"
        grads.append(grads_of(model))
        optimizer.step()
    session.close()
    assert gpu.violations == []
    return grads, steps


def assert_bitwise_equal(expected, actual) -> None:
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        for index, (a, b) in enumerate(zip(want, got, strict=True)):
            if a is None or b is None:
                assert a is None and b is None, f"step {step}: gradient {index} missing on one side"
                continue
            assert _same_bits(a, b), f"step {step}: gradient of parameter {index} differs"


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal: the same shape and dtype and the same bytes (a NaN where the other has the
    same NaN too, which ``torch.equal`` calls unequal: a model that diverges in plain training
    diverges alike offloaded)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def compare(
    make_model: Callable[[], nn.Module],
    batches: Sequence[object],
    loss_fn: Loss,
    schedule: SwapSchedule,
    gpu: SimulatedGPU,
    engine_type: type[OffloadEngine] = OffloadEngine,
) -> SimulatedRun:
    torch.manual_seed(0)
    reference = make_model()
    swapped = copy.deepcopy(reference)
    torch.manual_seed(1)  # the same dropout masks in both trainings
    expected = train_plain(reference, batches, loss_fn)
    torch.manual_seed(1)
    actual, run = train_simulated(swapped, batches, loss_fn, schedule, gpu, engine_type)
    assert_bitwise_equal(expected, actual)
    return run
