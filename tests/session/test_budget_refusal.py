"""A budget too small is refused at the end of the first backward, before any optimizer update,
naming a budget that then works on every run whatever the measured timings."""

import copy
import dataclasses
import random

import pytest
import torch

from lightning_accudnn import BudgetTooSmallError, OffloadConfig, OffloadSession
from lightning_accudnn.ops import OffloadEngine
from lightning_accudnn.profiling.bandwidth import HostLink
from tests.models import SmallResNet, loss_of, make_batch
from tests.session.helpers import memory_need


def _ballasted_resnet():
    """A residual CNN with 8 MB of static memory: the copy-out limit the budget implies (an eighth
    of it) then holds many layers' activations, so the host link's speed can matter to the peak."""
    model = SmallResNet()
    model.register_buffer("ballast", torch.zeros(2_000_000))
    return model


def _train(session, model, optimizer, steps):
    for index in range(steps):
        with session.step(model, optimizer):
            loss = loss_of(model, make_batch("cnn", 8, seed=index))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _scramble_timings(monkeypatch, seed):
    """Every measured layer time and the host link's bandwidth become random draws."""
    rng = random.Random(seed)
    end_step = OffloadEngine.end_step

    def scrambled(engine):
        stats = end_step(engine)
        if stats is None:
            return None
        layers = tuple(
            dataclasses.replace(
                layer,
                forward_seconds=rng.uniform(1e-6, 1e-2),
                backward_seconds=rng.uniform(1e-6, 2e-2),
            )
            for layer in stats.layers
        )
        return dataclasses.replace(stats, layers=layers)

    class RandomLink:
        def link_for(self, transfer_sizes=()):
            return HostLink(rng.uniform(1e6, 1e10), rng.uniform(1e6, 1e10))

    monkeypatch.setattr(OffloadEngine, "end_step", scrambled)
    monkeypatch.setattr("lightning_accudnn.session.session.probe_host_link", lambda device: RandomLink())


def test_too_small_budget_is_refused_before_any_update_and_the_named_budget_works_under_any_timings(
    monkeypatch,
):
    torch.manual_seed(0)
    model = _ballasted_resnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    static, saved = memory_need(copy.deepcopy(model), optimizer, "cnn")
    before = {name: value.clone() for name, value in model.named_parameters()}

    session = OffloadSession(OffloadConfig(budget=static + saved // 20, min_swap_bytes=0), "cpu")
    with pytest.raises(BudgetTooSmallError) as raised:
        _train(session, model, optimizer, steps=1)
    session.close()
    after = dict(model.named_parameters())
    assert all(torch.equal(value, after[name]) for name, value in before.items()), "a weight was updated"
    assert not optimizer.state, "the optimizer never stepped"
    named = raised.value.min_budget_bytes
    assert static + saved // 20 < named < static + saved

    for run in range(6):
        _scramble_timings(monkeypatch, seed=run)
        torch.manual_seed(run)
        model = _ballasted_resnet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        with OffloadSession(OffloadConfig(budget=named, min_swap_bytes=0), "cpu") as session:
            _train(session, model, optimizer, steps=4)  # the profiling pass, its plan, the refined plan
            assert session.plan is not None and session.plan.swapped_layers
            assert session.stats.peak_device_bytes <= named
