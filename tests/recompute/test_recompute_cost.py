"""A session plans recomputation at the cost the passes replayed under its plan measured it at."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import min_budget_bytes
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.session.plan_book import PlanSource
from tests.recompute.models import ColdRecomputation, SlowRecomputation, forcing_search

PAUSE = 0.02


def _model(cold: int | None = None) -> nn.Module:
    """Four blocks pausing PAUSE while recomputed: always, or in their first ``cold`` recomputations."""
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(
            nn.Linear(64, 64),
            SlowRecomputation(PAUSE) if cold is None else ColdRecomputation(PAUSE, cold),
            nn.Linear(64, 64),
            nn.ReLU(),
        )
        for _ in range(4)
    ]
    return nn.Sequential(*blocks, nn.Linear(64, 10))


Trained = tuple[list[Plan | None], list[PlanSource | None], OffloadSession]


def _train(budget: int, steps: int, policy: str = "recompute", cold: int | None = None) -> Trained:
    config = OffloadConfig(budget=budget, min_swap_bytes=0, reserve_bytes=0, policy=policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # on CPU nothing is saved
        session = OffloadSession(config, "cpu")
    model = _model(cold)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    plans, sources = [], []
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        inputs = torch.randn(32, 64, generator=generator)
        with session.step(model, optimizer):
            loss = nn.functional.cross_entropy(
                model(inputs), torch.randint(0, 10, (32,), generator=generator)
            )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert session.recomputer.timing is None  # set only while a pass runs
        session.wait_for_plans()
        plans.append(session.plan)
        sources.append(session.stats.plan_source if session.stats is not None else None)
    session.close()
    return plans, sources, session


def test_a_slow_recomputation_is_measured_and_planned_at_its_cost():
    (profiled, *_), _, _ = _train(10**9, 2)
    assert profiled is not None and profiled.profile.recompute_cost_ratio == 1.0
    budget = min_budget_bytes(profiled.profile, policy="recompute")
    plans, sources, _ = _train(budget, 7)
    first, final = plans[1], plans[-1]
    assert first is not None and first.recomputed and first.profile.recompute_cost_ratio == 1.0
    assert final is not None and final.recomputed and PlanSource.REFINED in sources
    # Each recomputed block pauses PAUSE seconds, far more than its forward on this CPU; the plan
    # charges what the fastest of its timed recomputations took.
    assert final.profile.recompute_cost_ratio > 3.0
    assert final.recompute_seconds >= PAUSE * len(final.recomputed) * (1 - 1e-9)
    assert first.recompute_seconds < final.recompute_seconds
    timed = {segment.name: segment.recompute_seconds for segment in final.profile.segments}
    assert all(timed[name] >= PAUSE for name in final.recomputed), timed
    # The timed backward held the recomputations' pauses; the profile's backward is without them.
    assert sum(layer.backward_seconds for layer in final.profile.layers) < PAUSE
    assert "recomputing measured at" in str(final)


def _keep_first_then_recompute_every_block(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The search replaced: the first plan keeps everything, every later one recomputes the four
    blocks. The list of searches made, as they are made."""
    keep, recompute = forcing_search(()), forcing_search(("0", "1", "2", "3"))
    searched: list[int] = []

    def search(*args, **kwargs):  # type: ignore[no-untyped-def]
        searched.append(len(searched))
        return (keep if len(searched) == 1 else recompute)(*args, **kwargs)

    monkeypatch.setattr(planner_plan, "search_mixed", search)
    return searched


def test_a_plan_that_first_recomputes_once_refined_is_made_again_at_the_cost_measured(monkeypatch):
    """The first plan keeps everything, the refined one recomputes every block (forced: the
    search is replaced): the passes replayed under it time the recomputations and find them
    far costlier than the plan charged, so the plan is made again at the cost measured."""
    searched = _keep_first_then_recompute_every_block(monkeypatch)
    plans, sources, _ = _train(10**9, 8, policy="auto")
    ratios = [plan.profile.recompute_cost_ratio if plan is not None else None for plan in plans]
    assert not plans[1].recomputed and ratios[1] == 1.0  # the first plan: nothing timed
    refined_at_forward = [i for i, plan in enumerate(plans) if plan.recomputed and ratios[i] == 1.0]
    assert refined_at_forward, ratios  # the refined plan, made before any recomputation ran
    final = plans[-1]
    assert final.recomputed and final.profile.recompute_cost_ratio > 3.0 and sources[-1] is PlanSource.REFINED
    assert final.recompute_seconds >= PAUSE * 4 * (1 - 1e-9)
    assert len(searched) >= 3


def test_a_recomputation_slow_only_in_the_first_pass_under_its_plan_is_charged_what_it_takes_after(
    monkeypatch,
):
    """As above, the refined plan recomputes every block; its first pass runs hooked and cold
    (on a GPU the allocator grows then): its recomputations pause, the later ones do not. No
    plan is made at the cold pass's cost; the plan is charged what the passes replayed after it
    timed."""
    _keep_first_then_recompute_every_block(monkeypatch)
    plans, _, session = _train(10**9, 14, policy="auto", cold=1)
    final = plans[-1]
    assert final is not None and final.recomputed
    # 4 x 20 ms against a forward of well under a millisecond: no plan charges that.
    ratios = [plan.profile.recompute_cost_ratio for plan in plans if plan is not None]
    assert all(ratio < 3.0 for ratio in ratios), ratios
    assert final.recompute_seconds < PAUSE
    # What the replayed passes timed: each segment well under the pause.
    costs = session._passes.steady_costs
    key = next(iter(costs._times))
    charged = costs.charged(key, final.profile)
    timed = {segment.name: segment.recompute_seconds for segment in charged.segments}
    assert all(timed[name] is not None and timed[name] < PAUSE for name in final.recomputed), timed
    assert not session.stats.steady_timing  # timed in full: nothing left to re-cost
