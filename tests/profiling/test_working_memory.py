"""What a traced step holds at once besides the model's state and its saved activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.trace import trace_step
from lightning_accudnn.profiling.working_memory import StorageLog

MIB4 = 4 * 2**20  # one 1024 x 1024 float32 tensor
SCALARS = 64  # the loss, its gradient: a few bytes


class _Scale(nn.Module):
    """``x * factor``: a product by a number saves nothing for backward."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def _working(*modules: nn.Module, shape: tuple[int, ...] = (1024, 1024)) -> tuple[int, int]:
    trace = trace_step(lambda: nn.Sequential(*modules), shape, tracker=LayerTracker())
    return trace.working_bytes, trace.saved_bytes


def test_outputs_nothing_saves_and_the_activation_gradients_count_at_their_most():
    """Nothing saves the products: forward holds two at a time; backward holds the output (the
    loss is its mean) and the gradients of the two products at once."""
    working, saved = _working(nn.Linear(1024, 1024), _Scale(2.0), _Scale(3.0))
    assert saved == MIB4  # the batch, saved by the linear layer
    assert 3 * MIB4 <= working <= 3 * MIB4 + SCALARS


def test_saved_activations_are_left_out():
    """ReLU saves its output (the step's): the saves are the ledger's, not working memory."""
    working, saved = _working(nn.Linear(1024, 1024), _Scale(2.0), _Scale(3.0), nn.ReLU())
    assert saved == 2 * MIB4
    assert 2 * MIB4 <= working <= 2 * MIB4 + SCALARS


def test_the_parameters_gradients_are_left_out():
    """The weight's gradient (64 MiB) is model state; the 16 KiB output and its gradient are not."""
    working, _ = _working(nn.Linear(4096, 4096, bias=False), shape=(1, 4096))
    assert 2 * 16 * 2**10 <= working <= 2 * 16 * 2**10 + SCALARS


def test_an_address_used_again_is_another_storage():
    log = StorageLog()
    kept = torch.ones(1024)
    keys = []
    for _ in range(50):  # each freed at once: the allocator hands the same address back
        temporary = torch.ones(1024)
        log.created([temporary])
        keys.append(log.key(temporary))
        del temporary
    log.created([kept])
    assert len(set(keys)) == 50
    assert log.peak_bytes() == 4096 and log.peak_bytes({log.key(kept)}) == 4096
    assert log.peak_bytes(set(keys)) == 4096  # the temporaries left out, the kept one remains


def test_a_cross_entropy_needs_logits_with_a_class_dimension():
    with pytest.raises(ValueError, match="class dimension last"):
        trace_step(
            lambda: nn.Sequential(nn.Linear(8, 1), nn.Flatten(0)),
            (4, 8),
            tracker=LayerTracker(),
            loss="cross-entropy",
        )
    with pytest.raises(ValueError, match="unknown loss 'l1': one of mean, cross-entropy"):
        trace_step(lambda: nn.Linear(8, 2), (4, 8), tracker=LayerTracker(), loss="l1")
