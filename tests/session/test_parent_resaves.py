"""A module's own code that saves before a submodule and, after it, saves the submodule's output
again: the re-save is placed after the submodule, not at the module's first save.

The module ``body`` below saves its input for ``softplus``, calls ``act`` (a ``Tanh``, which
saves its output), then saves that output again for ``sin``. The re-save's backward runs before
``act``'s, so the output is needed from the next layer to save on (``body`` noted as the module
that saved it again); placed at ``body``'s first save, before ``act``, it named an earlier
layer as the re-saver and the profile refused it: a ``ValueError`` inside the user's
``backward`` at the first step, under every policy.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_accudnn.profiling.resaves import ResaveLog
from tests.recompute.recorded_training import assert_bitwise_equal, cpu_session, train_recorded
from tests.session.helpers import run_counted


class _Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.softplus(x)  # saves x, before the submodule
        return torch.sin(self.act(x))  # saves the Tanh's output again, after it


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), _Body(), nn.Linear(32, 10))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(32, 16, generator=torch.Generator().manual_seed(step))


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


@pytest.mark.parametrize(
    ("policy", "share"), [("auto", 0.9), ("swap", 0.9), ("recompute", None), ("selective", None)]
)
def test_a_module_resaving_its_submodules_output_trains_as_plain_training(policy, share):
    """Every step trains to the plain loop's gradients, parameters and buffers, bit for bit, and
    no planned step passes its predicted peak (the ops' tensors as the allocator): at 0.9 of the
    kept peak where swapping reaches it, else (keeping or recomputing: nothing here frees enough)
    at an ample budget. On the base each raised the ValueError at the first step."""
    steps = 6
    budget = 10**10
    if share is not None:
        kept, _ = run_counted(_model(), _batch, _loss, 2, budget=budget, min_swap_bytes=0)
        budget = int(share * max(step.peak for step in kept))
    plain, _ = train_recorded(_model(), None, _batch, steps)
    session = cpu_session(budget, policy)
    offloaded, _ = train_recorded(_model(), session, _batch, steps)
    session.close()
    assert_bitwise_equal(offloaded, plain)
    seen, plan = run_counted(
        _model(), _batch, _loss, steps, budget=budget, min_swap_bytes=0, reserve_bytes=0, policy=policy
    )
    planned = [step for step in seen if step.predicted is not None]
    assert len(planned) == steps - 1
    assert all(step.peak <= step.predicted for step in planned), planned
    assert (plan.swapped_bytes > 0) == (share is not None)


def test_a_traced_resave_after_a_submodule_is_placed_at_the_next_saving_layer():
    """The trace (``accudnn plan``) lists re-saves as the engine does: ``body`` saved first, then
    ``body.act``; ``body``'s own code saves ``body.act``'s storage again. Its backward runs
    before ``body.act``'s, so the bytes are needed from the next layer to save on (``head``),
    with ``body`` noted as the module that saved them again (a recomputed segment holds the
    re-save only if it holds ``body``); with no later layer, from ``body.act``'s own backward."""
    log, saving = ResaveLog(), {"body": None, "body.act": None}
    log.note(7, "body", saving)
    assert log.listed({7: "body.act"}, {7: 64}, saving, read_in_forward=()) == ({}, {})
    saving["head"] = None
    assert log.listed({7: "body.act"}, {7: 64}, saving, read_in_forward=()) == (
        {"body.act": [("head", 64)]},
        {"body.act": [("body", 64)]},
    )
