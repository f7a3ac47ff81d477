"""The host-memory limit is a planner constraint: no plan swaps more host bytes than it allows,
and a budget that cannot be met within both limits says which limit, how much, and what to do."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner import LayerProfile, StepProfile, simulate
from lightning_accudnn.planner.plan import BudgetTooSmallError, HostLimitTooSmallError, plan_swaps
from tests.planner.strategies import profiles


def _host(swap, costs) -> int:
    return sum(cost for cost, swapped in zip(costs, swap, strict=True) if swapped)


def _fits_both(profile: StepProfile, cap: int, host_limit: int, costs) -> bool:
    """Some swap set fits the device (limit and window 0: its least memory) and the host."""
    for swap in itertools.product((False, True), repeat=len(profile.layers)):
        if _host(swap, costs) <= host_limit and simulate(profile, swap, 0, 0).peak_bytes <= cap:
            return True
    return False


@settings(max_examples=80, deadline=None)
@given(profiles(max_layers=6), st.floats(0.0, 1.2), st.floats(0.0, 1.0), st.booleans())
def test_plans_stay_within_the_host_limit_and_refuse_only_when_no_swap_set_fits_both(
    profile, fraction, host_share, rounded
):
    budget = int(profile.static_bytes + fraction * profile.saved_bytes)
    swappable = sum(layer.swappable_bytes for layer in profile.layers)
    host_limit = int(host_share * swappable)
    # "Rounded" host bytes: each layer's swap takes up to twice its bytes (a pinned pool).
    costs = [2 * layer.swappable_bytes if rounded else layer.swappable_bytes for layer in profile.layers]
    try:
        plan = plan_swaps(profile, budget, host_limit_bytes=host_limit, host_bytes=costs)
    except HostLimitTooSmallError as error:
        assert not _fits_both(profile, budget, host_limit, costs)
        assert error.host_bytes_needed > host_limit
        assert plan_swaps(profile, budget).predicted_peak_bytes <= budget  # the device alone fits
        return
    except BudgetTooSmallError:
        assert (
            simulate(profile, [layer.swappable_bytes > 0 for layer in profile.layers], 0, 0).peak_bytes
            > budget
        )
        return
    assert _host(plan.swap, costs) <= host_limit
    assert plan.predicted_peak_bytes <= budget


def test_the_error_names_the_host_limit_the_amount_and_what_to_change():
    # Within 1600 bytes: swap b, c and d (300 B to host) or more.
    layers = (LayerProfile("a", 400, 400, 1.0, 1.0), *(LayerProfile(n, 100, 100, 1.0, 1.0) for n in "bcd"))
    profile = StepProfile(layers, static_bytes=1_000)
    with pytest.raises(HostLimitTooSmallError) as caught:
        plan_swaps(profile, budget_bytes=1_600, host_limit_bytes=250)
    error = caught.value
    assert error.host_bytes_needed == 300
    message = str(error)
    assert "device budget of 1.60 KB and the host-memory limit of 250 B" in message
    assert "Raise host_memory_limit by at least 50 B (to 300 B" in message
    assert "at 1.70KB nothing is" in message and "lower the batch size" in message
    assert plan_swaps(profile, budget_bytes=1_600, host_limit_bytes=300).swapped_layers == {"b", "c", "d"}


def test_a_large_profile_under_a_host_limit_plans_heuristically_within_it():
    rng = random.Random(3)
    layers = tuple(
        LayerProfile(f"layer{i}", size, size, rng.uniform(1e-4, 1e-3), rng.uniform(2e-4, 2e-3))
        for i, size in enumerate(rng.randint(1, 50) * 10**6 for _ in range(120))
    )
    profile = StepProfile(layers, 10**9, 2e10, 2e10)
    budget = int(profile.static_bytes + 0.7 * profile.saved_bytes)
    free = plan_swaps(profile, budget)
    host_limit = int(0.9 * free.swapped_bytes)
    plan = plan_swaps(profile, budget, host_limit_bytes=host_limit)
    assert plan.search == "heuristic"
    assert plan.swapped_bytes <= host_limit < free.swapped_bytes
    assert plan.predicted_peak_bytes <= budget
