"""Plain-PyTorch measurements shared by the session tests (no Lightning)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn import OffloadSession, OffloadStats
from lightning_accudnn.profiling.static_memory import model_state_bytes
from tests.models import loss_of, make_batch
from tests.session_training import measured_pass, session_steps


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
