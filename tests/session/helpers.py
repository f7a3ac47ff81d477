"""Plain-PyTorch measurements shared by the session tests (no Lightning)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.planner.static_memory import model_state_bytes
from tests.models import loss_of, make_batch


def memory_need(
    model: nn.Module, optimizer: torch.optim.Optimizer, kind: str, batch_size: int = 8
) -> tuple[int, int]:
    """(model state with the optimizer's state, saved activations) of one step of ``model``."""
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = loss_of(model, make_batch(kind, batch_size))
    loss.backward()
    stats = engine.end_step()
    model.zero_grad(set_to_none=True)
    assert stats is not None
    return model_state_bytes(model, [optimizer]), sum(layer.saved_bytes for layer in stats.layers)
