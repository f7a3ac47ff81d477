"""The planner: feasibility, optimality against brute force, errors, speed and reports."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner import (
    BudgetTooSmallError,
    LayerProfile,
    Plan,
    StepProfile,
    lower_bound_seconds,
    plan_swaps,
    simulate,
)
from lightning_accudnn.planner.timeline import Simulator
from tests.planner.strategies import brute_force, profiles


def _swap_all(profile: StepProfile) -> list[bool]:
    return [layer.swappable_bytes > 0 for layer in profile.layers]


def _random_profile(rng: random.Random, count: int, bandwidth: float) -> StepProfile:
    layers = []
    for i in range(count):
        saved = rng.randint(1, 50) * 10**6
        swappable = saved if rng.random() < 0.8 else rng.randint(0, saved)
        layers.append(
            LayerProfile(f"layer{i}", saved, swappable, rng.uniform(1e-4, 1e-3), rng.uniform(2e-4, 2e-3))
        )
    return StepProfile(tuple(layers), 10**9, bandwidth, bandwidth)


# -- brute force ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(profiles(max_layers=5), st.floats(0.0, 1.2), st.integers(0, 20))
def test_equal_to_brute_force_on_small_instances(profile, fraction, reserve):
    """Exact search: the same least step time as every swap set x limit x window."""
    budget = int(profile.static_bytes + fraction * profile.saved_bytes) + reserve
    best_time, least_peak = brute_force(profile, budget - reserve)
    if best_time is None:
        with pytest.raises(BudgetTooSmallError) as caught:
            plan_swaps(profile, budget, reserve)
        assert caught.value.min_budget_bytes == least_peak + reserve
        plan = plan_swaps(profile, caught.value.min_budget_bytes, reserve)  # exactly enough
        assert plan.predicted_peak_bytes <= caught.value.min_budget_bytes - reserve
        return
    plan = plan_swaps(profile, budget, reserve)
    assert plan.search in ("exhaustive", "nothing to swap")
    assert plan.predicted_step_seconds == pytest.approx(best_time, rel=1e-9, abs=1e-12)
    assert plan.predicted_peak_bytes <= budget - reserve
    assert plan.min_budget_bytes == least_peak + reserve
    timeline = simulate(profile, plan.swap, plan.prefetch_window_bytes, plan.max_copying_out_bytes)
    assert (timeline.peak_bytes, timeline.step_seconds) == (
        plan.predicted_peak_bytes,
        plan.predicted_step_seconds,
    )


# -- properties on every size (the larger ones use the heuristic) ----------------------------


@settings(max_examples=60, deadline=None)
@given(profiles(min_layers=0, max_layers=24), st.floats(0.0, 1.2), st.sampled_from([0, 5]))
def test_feasible_whenever_swapping_everything_fits_and_never_slower(profile, fraction, reserve):
    budget = int(profile.static_bytes + fraction * profile.saved_bytes) + reserve
    cap = budget - reserve
    swap_all = simulate(profile, _swap_all(profile), 0, 0)
    swap_all_wide = simulate(profile, _swap_all(profile), 10**12, 0)
    try:
        plan = plan_swaps(profile, budget, reserve)
    except BudgetTooSmallError as error:
        assert swap_all.peak_bytes > cap
        assert error.min_budget_bytes > budget
        assert error.min_budget_bytes == swap_all.peak_bytes + reserve
        plan_swaps(profile, error.min_budget_bytes, reserve)  # exactly enough
        return
    assert plan.predicted_peak_bytes <= cap
    assert plan.min_budget_bytes <= min(budget, swap_all.peak_bytes + reserve)
    if swap_all.peak_bytes <= cap:
        assert plan.predicted_step_seconds <= swap_all.step_seconds * (1 + 1e-12)
    if swap_all_wide.peak_bytes <= cap:
        assert plan.predicted_step_seconds <= swap_all_wide.step_seconds * (1 + 1e-12)
    if profile.unconstrained_peak_bytes <= cap:
        assert not any(plan.swap) and plan.swapped_layers == frozenset()
        assert plan.prefetch_window_bytes == 0
    assert plan.bound_ratio >= 1 - 1e-9
    assert plan.lower_bound_seconds == lower_bound_seconds(profile, budget)


@pytest.mark.parametrize("bandwidth", [float("inf"), 2e10, 1e10])
def test_large_profiles_use_the_heuristic_and_fit(bandwidth):
    rng = random.Random(7)
    profile = _random_profile(rng, 200, bandwidth)
    budget = int(profile.static_bytes + 0.85 * profile.saved_bytes)
    plan = plan_swaps(profile, budget, reserve_bytes=10**8)
    assert plan.search == "heuristic"
    assert 0 < plan.predicted_peak_bytes <= budget - 10**8
    swap_all = simulate(profile, _swap_all(profile), 0, 0)
    assert plan.predicted_step_seconds <= swap_all.step_seconds
    assert plan.swapped_bytes < sum(layer.swappable_bytes for layer in profile.layers)


def test_thousand_layers_plan_with_a_bounded_number_of_simulations(monkeypatch):
    """Algorithmic-complexity guard: the heuristic simulates a bounded number of candidates
    (each simulation is linear in the layers), counted rather than timed."""
    simulations = []
    simulate = Simulator.times

    def counted(self, choice):
        simulations.append(choice)
        return simulate(self, choice)

    monkeypatch.setattr(Simulator, "times", counted)
    rng = random.Random(0)
    profile = _random_profile(rng, 1000, 2e10)
    budget = int(profile.static_bytes + 0.8 * profile.saved_bytes)
    plan = plan_swaps(profile, budget)
    assert plan.predicted_peak_bytes <= budget and plan.search == "heuristic"
    assert 0 < len(simulations) <= 300, f"{len(simulations)} simulations for 1000 layers"


# -- nothing to swap, errors ---------------------------------------------------------------


def test_everything_fits_swaps_nothing():
    profile = StepProfile(
        tuple(LayerProfile(f"l{i}", 100, 100, 1e-3, 2e-3) for i in range(3)),
        static_bytes=1000,
        d2h_bytes_per_second=1e3,
        h2d_bytes_per_second=1e3,
    )
    plan = plan_swaps(profile, budget_bytes=1300)
    assert plan.swap == (False, False, False)
    assert (plan.predicted_peak_bytes, plan.swapped_bytes, plan.prefetch_window_bytes) == (1300, 0, 0)
    assert plan.predicted_step_seconds == pytest.approx(9e-3)
    assert plan.bound_ratio == pytest.approx(1.0)


def test_budget_too_small_names_the_least_budget():
    """M = 1 GB; a, b, c: 0.5 GB each; a and b all swappable, c half; free copies, 1 s ops.

    Nothing swapped: 1 + 1.5 = 2.5 GB. The least peak swaps everything with limit and window 0:
      F_a 1.5; F_b 1 + 0.5 (a in flight) + 0.5 = 2.0, b's push retires a;
      F_c 1 + 0.5 (b in flight) + 0.5 = 2.0, c's push (0.25) retires b, c stays;
      backward, during B_c: 1 + 0.5 (all of c) + 0.5 (b may come back at once) = 2.0;
      B_b 1 + 0.5; B_a 1 + 0.5.
    So the least budget is 2.0 GB plus the 0.1 GB reserve.
    """
    half = 5 * 10**8
    profile = StepProfile(
        (
            LayerProfile("a", half, half, 1.0, 1.0),
            LayerProfile("b", half, half, 1.0, 1.0),
            LayerProfile("c", half, half // 2, 1.0, 1.0),
        ),
        static_bytes=10**9,
    )
    with pytest.raises(BudgetTooSmallError) as caught:
        plan_swaps(profile, budget_bytes=2 * 10**9, reserve_bytes=10**8)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.min_budget_bytes == 21 * 10**8
    assert (error.budget_bytes, error.reserve_bytes) == (2 * 10**9, 10**8)
    message = str(error)
    assert "at least 2.10GB" in message and "batch size" in message and "budget" in message
    assert "min_swap_bytes" not in message  # the profile lists no small storages
    plan = plan_swaps(profile, budget_bytes=error.min_budget_bytes, reserve_bytes=10**8)
    assert plan.predicted_peak_bytes == 2 * 10**9
    assert plan.swapped_layers == {"a", "b", "c"}
    assert (plan.max_copying_out_bytes, plan.prefetch_window_bytes) == (0, 0)
    assert plan.min_budget_bytes == error.min_budget_bytes


def test_budget_too_small_says_when_min_swap_bytes_limits_it():
    """a, b, c: 1000 bytes each in ten 100-byte storages, all below min_swap_bytes; M = 0.

    Nothing may swap: the smallest budget is 3000. With min_swap_bytes=100 everything may,
    and the least peak is 2000 (F_b: a in flight + b; during B_c: c + one storage of b)."""
    layers = tuple(LayerProfile(name, 1000, 0, small_storages=(100,) * 10) for name in "abc")
    profile = StepProfile(layers, static_bytes=0)
    with pytest.raises(BudgetTooSmallError) as caught:
        plan_swaps(profile, budget_bytes=1000)
    error = caught.value
    assert error.min_budget_bytes == 3000
    assert error.smaller_min_swap_bytes == (100, 2000)
    assert "min_swap_bytes=100" in str(error) and "1.00 KB less" in str(error)
    plan_swaps(profile.with_min_swap_bytes(100), budget_bytes=2000)  # the advice holds


def test_negative_reserve_is_refused():
    with pytest.raises(ValueError, match="reserve_bytes"):
        plan_swaps(StepProfile((), static_bytes=0), budget_bytes=10, reserve_bytes=-1)


# -- lower bound ---------------------------------------------------------------------------


def test_lower_bound():
    """X = 500 + 100 - 300 = 300 B must leave: max(T_fwd 1, 300/100 = 3) + max(T_bwd 2, 300/50 = 6) = 9."""
    profile = StepProfile(
        (LayerProfile("a", 200, 200, 0.5, 1.0), LayerProfile("b", 300, 300, 0.5, 1.0)),
        static_bytes=100,
        d2h_bytes_per_second=100.0,
        h2d_bytes_per_second=50.0,
    )
    assert lower_bound_seconds(profile, 300) == 9.0
    assert lower_bound_seconds(profile, 600) == 3.0  # fits: T_fwd + T_bwd
    assert lower_bound_seconds(StepProfile(profile.layers, 100), 300) == 3.0  # free copies


# -- reports -------------------------------------------------------------------------------


def _example_plan() -> Plan:
    profile = StepProfile(
        tuple(LayerProfile(f"block{i}.conv", 10**8, 10**8, 10e-3, 20e-3) for i in range(5)),
        static_bytes=10**9,
        d2h_bytes_per_second=2e10,
        h2d_bytes_per_second=2e10,
    )
    return plan_swaps(profile, budget_bytes=int(1.45e9), reserve_bytes=10**7)


def test_str_lists_every_layer_and_the_summary():
    plan = _example_plan()
    text = str(plan)
    for layer in plan.profile.layers:
        assert layer.name in text
    for word in (
        "predicted peak",
        "budget",
        "predicted step",
        "lower bound",
        "bound ratio",
        "swap",
        "keep",
        "recomputed",
    ):
        assert word in text
    assert f"{plan.bound_ratio:.3f}" in text
    assert len(text.splitlines()) == 1 + len(plan.profile.layers) + 6


def test_to_dict_is_json():
    plan = _example_plan()
    data = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    for key in (
        "predicted_peak_bytes",
        "predicted_step_seconds",
        "min_budget_bytes",
        "lower_bound_seconds",
        "layers",
    ):
        assert key in data
    assert data["predicted_peak_bytes"] == plan.predicted_peak_bytes
    assert [layer["name"] for layer in data["layers"]] == [layer.name for layer in plan.profile.layers]
    assert {layer["name"] for layer in data["layers"] if layer["swap"]} == plan.swapped_layers
    assert set(data["layers"][0]) >= {"saved_bytes", "swappable_bytes", "forward_seconds", "backward_seconds"}
    free = plan_swaps(StepProfile((LayerProfile("a", 1, 1),), 0), 10).to_dict()
    assert free["d2h_bytes_per_second"] is None  # infinite bandwidth, valid JSON
    json.dumps(free, allow_nan=False)


def test_plan_properties():
    plan = _example_plan()
    assert plan.swapped_layers == frozenset(
        layer.name for layer, swapped in zip(plan.profile.layers, plan.swap, strict=True) if swapped
    )
    assert plan.swapped_bytes == 10**8 * len(plan.swapped_layers)
    assert plan.bound_ratio == plan.predicted_step_seconds / plan.lower_bound_seconds
    assert plan.timeline is not None and plan.timeline.peak_bytes == plan.predicted_peak_bytes
