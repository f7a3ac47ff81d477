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


def test_a_batch_size_the_tuner_finds_too_large_names_a_budget_that_plans_it_under_the_default_reserve():
    from lightning_accudnn.callbacks.prediction import predict_batch_sizes
    from lightning_accudnn.planner import format_bytes, plan_swaps, scale_profile
    from lightning_accudnn.session.config import smallest_budget_bytes

    budget = 12 * GB
    reserve = default_reserve_bytes(budget, "cuda")
    larger = scale_profile(PROFILE, 4.0)  # batch 32 measured at 8

    def plans(at: int) -> bool:
        try:
            plan_swaps(larger, at, default_reserve_bytes(at, "cuda"), policy="swap")
        except BudgetTooSmallError:
            return False
        return True

    def named(**options) -> str:
        predictions = predict_batch_sizes(
            PROFILE, 8, None, [8, 32], budget, reserve, policy="swap", **options
        )
        assert predictions[8].feasible and not predictions[32].feasible
        return predictions[32].reason

    with pytest.raises(BudgetTooSmallError) as refused:
        plan_swaps(larger, budget, reserve, policy="swap")
    fixed = refused.value.min_budget_bytes  # named from the 12 GB budget's reserve
    assert f"needs a budget of {format_bytes(fixed)}" in named()
    assert not plans(fixed), "a budget named from a fixed reserve is refused under its own"

    needed = smallest_budget_bytes(fixed - reserve, "cuda")
    assert f"needs a budget of {format_bytes(needed)}" in named(
        budget_for=lambda usable: smallest_budget_bytes(usable, "cuda")
    )
    assert plans(needed) and not plans(needed - 1)
