"""A graph that changes in a pass replayed under a plan, after a layer whose storage a later
layer saves again: the pass trains as plain autograd does, nothing is planned or re-costed from
it (it lists its saves from the change on as one layer), and the next pass, hooked, is planned
from layer by layer."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.ops.engine import CHANGED_GRAPH_LAYER
from tests.session.helpers import sgd


class _Doubling(nn.Module):
    """Linear and ReLU blocks, then a Linear: each Linear saves the ReLU output before it again.
    With ``doubled`` the first block's output is doubled before the second block, whose Linear
    then saves a new tensor where the plan replays a save of the first ReLU's storage."""

    def __init__(self, depth: int = 8) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(64, 256), nn.ReLU())
        self.rest = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(depth)])
        self.last = nn.Linear(256, 64)
        self.doubled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if self.doubled:
            h = h * 2.0
        return self.last(self.rest(h))


def _train(session: OffloadSession, model: nn.Module, steps: range, change_at: int) -> None:
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = sgd(model), sgd(reference)
    for step in steps:
        if step == change_at:
            model.doubled = reference.doubled = True
        x = torch.randn(512, 64, generator=torch.Generator().manual_seed(step))
        with session.step(model, optimizer):
            loss = model(x).square().mean()
        loss.backward()
        reference(x).square().mean().backward()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), f"step {step}"
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("change_at", [3, 5])  # 5: the pass the plan is re-costed after
def test_a_graph_changed_after_a_saved_again_storage_is_planned_from_and_trains_as_plain_autograd(change_at):
    torch.manual_seed(0)
    model = _Doubling()
    kept = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0, reserve_bytes=0), "cpu")
    _train(kept, copy.deepcopy(model), range(2), change_at=-1)
    assert kept.stats is not None
    peak = kept.stats.ledger_peak_bytes
    kept.close()
    session = OffloadSession(
        OffloadConfig(
            budget=int(peak * 0.85),
            min_swap_bytes=0,
            reserve_bytes=0,
            policy="swap",
            plan_in_background=False,
        ),
        "cpu",
    )
    _train(session, model, range(12), change_at=change_at)
    assert session.plan is not None and session.plan.swapped_layers
    # Planned from the hooked pass after the change, layer by layer: the second block's Linear
    # now saves the doubled tensor, its own.
    names = [layer.name for layer in session.plan.profile.layers]
    assert "rest.0.0" in names and "rest.7.1" in names and CHANGED_GRAPH_LAYER not in names
    session.close()
