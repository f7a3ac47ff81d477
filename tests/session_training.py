"""A small CNN trained under an OffloadSession, or measured by a bare engine (host-memory tests)."""

from collections.abc import Callable

import torch

from lightning_accudnn.ops import OffloadEngine, StepStats, SwapSchedule
from lightning_accudnn.session import OffloadSession, OffloadStats
from tests.models import loss_of, make_batch


def session_steps(
    session: OffloadSession,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_at: Callable[[int], torch.Tensor],
    steps: range,
    settle: bool = False,
) -> list[OffloadStats]:
    """A training step of ``model`` under ``session.step`` for each number of ``steps``, its loss
    ``loss_at(number)``; the session's stats after each. With ``settle``, the plans being made on
    planning threads are waited for after each step, so that which passes are timed and plan does
    not depend on how fast the machine plans."""
    stats = []
    for step in steps:
        with session.step(model, optimizer):
            loss = loss_at(step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if settle:
            session.wait_for_plans()
        assert session.stats is not None
        stats.append(session.stats)
    return stats


def train_cnn(
    session: OffloadSession, model: torch.nn.Module, steps: int, settle: bool = False
) -> list[OffloadStats]:
    """``steps`` SGD steps of ``model`` on the "cnn" batches, each under ``session.step``; the
    session's stats after each (``settle``: see :func:`session_steps`)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return session_steps(
        session,
        model,
        optimizer,
        lambda index: loss_of(model, make_batch("cnn", seed=index)),
        range(steps),
        settle,
    )


def measured_pass(
    model: torch.nn.Module, loss_of_model: Callable[[torch.nn.Module], torch.Tensor]
) -> StepStats:
    """One forward (``loss_of_model(model)``) and backward, everything kept, as the engine saw it."""
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = loss_of_model(model)
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    return stats


def measured_cnn_pass(model: torch.nn.Module) -> StepStats:
    """One forward and backward of ``model`` on the "cnn" batch, everything kept, as the engine saw it."""
    return measured_pass(model, lambda module: loss_of(module, make_batch("cnn")))
