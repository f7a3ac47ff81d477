"""A session measures the host's time per swapped storage in the passes it times whole, and
plans from then on charge it per layer's storages.

Whether the plan in force is made again from those passes depends on how far their times move
its step (``warm_times.RECOMPUTE_COST_TOLERANCE``): on a loaded machine the compute is slow and
the host's share too small to move it. The tolerance is 0 here, so that the plan is made again
whatever the machine's load, and it is that plan which must charge the host's time."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import min_budget_bytes
from lightning_accudnn.session import warm_times
from tests.recompute.models import batch, build, loss_of
from tests.recompute.training import measured_profile

STEPS = 12  # the profiling pass, the timed planned passes, the steady passes timed whole, more


def test_plans_after_the_steady_passes_charge_the_host_time_of_each_swapped_storage(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(warm_times, "RECOMPUTE_COST_TOLERANCE", 0.0)
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="swap")
    profile = measured_profile("resnet", config)
    least = min_budget_bytes(profile)
    budget = (least + profile.unconstrained_peak_bytes) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config.replace(budget=budget), "cpu")
    model = build("resnet")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    charged = []
    for step in range(STEPS):
        with session.step(model, optimizer):
            loss = loss_of(model, *batch("resnet", step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        session.wait_for_plans()
        assert session.plan is not None
        charged.append(session.plan.profile.swap_host_seconds)
    session.close()
    assert charged[0] == (0.0, 0.0)  # planned from the profiling pass: nothing measured yet
    forward, backward = charged[-1]
    assert forward > 0.0 and backward > 0.0
    assert session.stats is not None and session.stats.host_seconds_per_swapped_storage is not None
    assert session.stats.host_seconds_per_swapped_storage <= forward + backward  # the least measured since
    layers = session.plan.profile.layers
    assert all(layer.swappable_storages > 0 for layer in layers if layer.swappable_bytes > 0)
    assert session.plan.swapped_layers
