"""A budget a refusal names works: with the default reserve, which grows with the budget on
CUDA (5 % of it past 256 MiB), the budget named is the smallest whose usable part holds the
plan's need, so that training at it plans, and a byte less is refused."""

import pytest
import torch

from lightning_accudnn.ops import OffloadEngine
from lightning_accudnn.planner import BudgetTooSmallError, StepProfile
from lightning_accudnn.planner.headroom import Headroom
from lightning_accudnn.profile import LayerProfile
from lightning_accudnn.session.config import default_reserve_bytes
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.planning import SessionPlanning

GB = 10**9
KEY = PassKey(model=1, batch=(), position=0)
#: Eight layers of 1 GB each over 4 GB of model state: the least plan needs several GB.
PROFILE = StepProfile(
    tuple(LayerProfile(f"l{i}", GB, GB, 1e-3, 2e-3) for i in range(8)),
    static_bytes=4 * GB,
    d2h_bytes_per_second=25e9,
    h2d_bytes_per_second=25e9,
)


def _planning(budget: int, rule: str | None) -> SessionPlanning:
    engine = OffloadEngine(torch.device("cpu"), host_memory_limit=10**12)
    room = Headroom(budget, default_reserve_bytes(budget, "cuda"))
    return SessionPlanning(
        room, engine, policy="swap", min_swap_bytes=0, report=lambda line: None, reserve_rule=rule
    )


def _named(rule: str | None) -> int:
    with pytest.raises(BudgetTooSmallError) as refused:
        _planning(2 * GB, rule).make_plan(PROFILE, KEY)
    return refused.value.min_budget_bytes


def test_the_budget_named_under_the_default_reserve_plans_and_a_byte_less_does_not():
    named = _named("cuda")
    plan = _planning(named, "cuda").make_plan(PROFILE, KEY)
    assert plan.predicted_peak_bytes <= named - default_reserve_bytes(named, "cuda")
    with pytest.raises(BudgetTooSmallError):
        _planning(named - 1, "cuda").make_plan(PROFILE, KEY)


def test_a_budget_named_from_the_reserve_of_the_budget_refused_would_be_refused_again():
    """Named from the 256 MiB reserve of the 2 GB budget refused, it gets a larger reserve."""
    named = _named(None)
    assert named < _named("cuda")
    with pytest.raises(BudgetTooSmallError):
        _planning(named, "cuda").make_plan(PROFILE, KEY)


def test_the_budget_at_which_nothing_is_swapped_is_named_with_its_own_reserve():
    """The host pool holds too little for any plan the budget allows: the error names the budget
    at which nothing is swapped, and its usable part holds everything, its own reserve taken."""
    from lightning_accudnn.ops import HostMemoryExceeded

    engine = OffloadEngine(torch.device("cpu"), host_memory_limit=GB // 2)
    budget = 10 * GB
    room = Headroom(budget, default_reserve_bytes(budget, "cuda"))
    planning = SessionPlanning(
        room, engine, policy="swap", min_swap_bytes=0, report=lambda line: None, reserve_rule="cuda"
    )
    with pytest.raises(HostMemoryExceeded) as raised:
        planning.make_plan(PROFILE, KEY)
    nothing_swapped = raised.value.__cause__.nothing_swapped_budget_bytes
    everything = PROFILE.static_bytes + PROFILE.saved_bytes
    assert nothing_swapped - default_reserve_bytes(nothing_swapped, "cuda") >= everything
