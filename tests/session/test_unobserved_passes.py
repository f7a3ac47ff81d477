"""Steady state under a plan that keeps everything: passes run without the engine's
hooks but one in ``observe_every`` of each kind, train bitwise like the plain loop, and
a graph changed in an unobserved pass is planned from once the next observed pass sees it."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.session.helpers import sgd

EVERY = 8


class _Switchable(nn.Module):
    """A small MLP; ``extra`` adds a layer that saves its output (same input, other graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.LayerNorm(32))
        self.extra_layer = nn.Tanh()
        self.extra = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return self.extra_layer(y) if self.extra else y


def test_kept_plans_run_mostly_unobserved_train_bitwise_and_a_changed_graph_is_planned_from():
    torch.manual_seed(0)
    model = _Switchable()
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = sgd(model), sgd(reference)
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0, observe_every=EVERY), "cpu")
    change_at, steps = 20, 20 + 2 * EVERY
    observed, has_extra = [], []
    for step in range(steps):
        if step == change_at:
            model.extra = reference.extra = True
        x = torch.randn(8, 16)
        with session.step(model, optimizer):
            loss = model(x).square().mean()
        loss.backward()
        reference(x).square().mean().backward()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad), f"step {step}"
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
        assert session.stats is not None and session.plan is not None
        assert not session.plan.swapped_layers and not session.plan.recomputed
        observed.append(session.stats.observed)
        has_extra.append(any(layer.name == "extra_layer" for layer in session.plan.profile.layers))
    session.close()

    steady = observed[5:change_at]
    assert steady.count(False) >= len(steady) // 2  # most steady-state passes skip the hooks
    runs, longest = 0, 0
    for seen in observed:
        runs = 0 if seen else runs + 1
        longest = max(longest, runs)
    assert longest <= EVERY - 1  # never more unobserved passes in a row
    # The change shows at the next observed pass; the pass after it runs hooked and is planned from.
    assert not any(has_extra[:change_at])
    assert all(has_extra[change_at + EVERY + 1 :])
    for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_observe_every_one_observes_every_pass_and_bad_values_are_refused():
    model = _Switchable()
    optimizer = sgd(model)
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0, observe_every=1), "cpu")
    observed = []
    for _ in range(12):
        with session.step(model, optimizer):
            loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        observed.append(session.stats.observed)
    session.close()
    assert all(observed)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="observe_every must be an int >= 1"):
            OffloadConfig(observe_every=bad)
