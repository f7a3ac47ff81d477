"""Plain-PyTorch measurements shared by the session tests (no Lightning)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession, OffloadStats
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.testing import OpBytesAllocator
from tests.models import loss_of, make_batch
from tests.session_training import measured_pass, session_steps


def class_rows(step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` random rows of 16 features and their labels (10 classes), seeded by ``step``."""
    generator = torch.Generator().manual_seed(step)
    return torch.randn(rows, 16, generator=generator), torch.randint(0, 10, (rows,), generator=generator)


def cross_entropy_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The cross-entropy of ``model``'s logits (in float32, as under autocast) on ``batch``."""
    inputs, labels = batch
    return F.cross_entropy(model(inputs).float(), labels)


def memory_need(
    model: nn.Module, optimizer: torch.optim.Optimizer, kind: str, batch_size: int = 8
) -> tuple[int, int]:
    """(model state with the optimizer's state, saved activations) of one step of ``model``."""
    stats = measured_pass(model, lambda module: loss_of(module, make_batch(kind, batch_size)))
    model.zero_grad(set_to_none=True)
    return model_state_bytes(model, [optimizer]), sum(layer.saved_bytes for layer in stats.layers)


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of the session tests' training loops."""
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def seeded_steps(
    session: OffloadSession, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, first: int = 0
) -> list[OffloadStats]:
    """Training steps ``first`` to ``first + steps - 1`` of ``model`` (64 features in) under
    ``session``, each on a batch of 32 seeded by its number (squared output's mean as the loss):
    each step's stats."""

    def loss_at(step: int) -> torch.Tensor:
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step))
        return model(x).square().mean()

    return session_steps(session, model, optimizer, loss_at, range(first, first + steps))


@dataclass(frozen=True)
class CountedStep:
    """One training step's figures, and the profile its plan was made from then."""

    peak: int
    predicted: int | None
    usable: int
    reserve: int
    profile: StepProfile
    swapped: int


def run_counted(
    model: nn.Module,
    batch,
    loss,
    steps: int,
    *,
    momentum: float = 0.0,
    optimizer=None,
    counted_optimizer: bool = False,
    autocast: bool = False,
    backward_in_autocast: bool = False,
    **config,
):
    """``steps`` steps of ``model`` through a session (plans made inline, ``config`` its other
    settings), the ops' tensors as the allocator: ``batch(step)`` makes a step's batch, and
    ``loss(model, batch)`` its loss; SGD unless ``optimizer`` is given. With
    ``counted_optimizer`` the allocator counts the optimizer's step and its state too (as CUDA's
    does); with ``autocast`` the forward runs under CPU autocast in bfloat16, and with
    ``backward_in_autocast`` the backward too (the step's context left inside autocast). The
    steps' figures, and the last plan."""
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    allocator = OpBytesAllocator(base_bytes=parameters)
    session = OffloadSession(OffloadConfig(plan_in_background=False, **config), "cpu", allocator=allocator)
    precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    seen = []
    for step in range(steps):
        with allocator.counting():
            inputs = batch(step)
            if backward_in_autocast:
                with precision:
                    with session.step(model, optimizer):
                        value = loss(model, inputs)
                    value.backward()
            else:
                with session.step(model, optimizer), precision:
                    value = loss(model, inputs)
                value.backward()
            del inputs, value  # the next step's batch is not made beside this one
            if counted_optimizer:
                optimizer.step()
        if not counted_optimizer:
            optimizer.step()
        optimizer.zero_grad()  # the gradients go: the next backward makes them again
        stats = session.stats
        seen.append(
            CountedStep(
                stats.peak_device_bytes,
                stats.predicted_peak_bytes,
                session.headroom.usable_bytes,
                session.reserve_bytes,
                session.plan.profile,
                stats.bytes_swapped_out,
            )
        )
    plan = session.plan
    session.close()
    return seen, plan
