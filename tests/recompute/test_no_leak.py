"""Steady training holds no more tensors after each step than after the one before: no pass, under
any kind of plan, leaves what it saved, copied or recomputed alive (on a GPU, memory that would
grow every step until the budget is gone)."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner.plan import min_budget_bytes
from tests.recompute.models import batch, build, loss_of
from tests.recompute.training import measured_profile

STEADY_STEPS = 4


def _live_tensors() -> int:
    gc.collect()
    return sum(issubclass(type(value), torch.Tensor) for value in gc.get_objects())


@pytest.mark.parametrize(
    ("kind", "policy"),
    [("resnet", "recompute"), ("gpt", "recompute"), ("gpt", "selective"), ("resnet", "swap")],
)
def test_steady_steps_leave_no_tensor_alive(kind, policy):
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy=policy)
    profile = measured_profile(kind, config)
    if policy == "swap":
        budget = profile.static_bytes + profile.saved_bytes // 2
    else:
        budget = min_budget_bytes(profile, policy=policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config.replace(budget=budget), "cpu")
    model = build(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(index: int) -> None:
        with session.step(model, optimizer):
            loss = loss_of(model, *batch(kind, index % 2))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    # Profiling, the timed passes, the plan made from them adopted, the passes replayed under it
    # timed, and the plan they may re-cost adopted in turn: until a pass changes nothing more.
    for index in range(20):
        ran = session.plan
        step(index)
        session.wait_for_plans()
        stats = session.stats
        if not stats.timed and not stats.steady_timing and session.plan is ran:
            break
    plan = session.plan
    assert plan is not None and (plan.recomputed if policy != "swap" else plan.swapped_layers)
    live = []
    for index in range(STEADY_STEPS):
        step(index)
        live.append(_live_tensors())
    assert session.plan is plan
    # What the last passes before the steady state left goes with the first steady ones: never more.
    assert all(after <= before for before, after in zip(live, live[1:], strict=False)), live
    session.close()
