"""Hidden chains: swap sets whose copies out the compute never waits for at copy-out limit 0,
and the search that tries them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner.plan import plan_swaps
from lightning_accudnn.planner.swap_search import chain_search, hidden_chain, least_peak_choice, search
from lightning_accudnn.planner.timeline import PlanChoice, Simulator, unconstrained_seconds
from lightning_accudnn.profile import LayerProfile, StepProfile


@st.composite
def profiles(draw) -> StepProfile:
    count = draw(st.integers(2, 12))
    layers = []
    for i in range(count):
        saved = draw(st.integers(1, 120))
        swappable = draw(st.one_of(st.just(saved), st.integers(0, saved)))
        seconds = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0]))
        layers.append(LayerProfile(f"l{i}", saved, swappable, seconds, 2 * seconds))
    link = draw(st.sampled_from([20.0, 50.0, 200.0]))
    return StepProfile(tuple(layers), draw(st.integers(0, 100)), link, link)


@settings(max_examples=60, deadline=None)
@given(profiles(), st.integers(0, 120))
def test_a_hidden_chain_never_makes_the_forward_wait(profile, least) -> None:
    simulator = Simulator(profile)
    swap = hidden_chain(simulator, least)
    for swapped, layer in zip(swap, profile.layers, strict=True):
        assert not swapped or layer.swappable_bytes > 0
    timeline = simulator.timeline(PlanChoice(swap, 0, 0))
    forward = sum(layer.forward_seconds for layer in profile.layers)
    assert timeline.forward_seconds == pytest.approx(forward, rel=1e-12)
    # every chained layer but the last one swapped is retired at limit 0
    assert sum(1 for row in timeline.layers if row.swapped and not row.retired) <= 1


@settings(max_examples=40, deadline=None)
@given(profiles(), st.floats(0.0, 1.0))
def test_the_search_is_never_slower_than_its_quick_chain_plan(profile, share) -> None:
    simulator = Simulator(profile)
    least = simulator.peak_bytes(least_peak_choice(simulator))
    cap = least + int(share * (profile.unconstrained_peak_bytes - least))
    chained = chain_search(simulator, cap)
    best = search(simulator, cap).best
    assert best is not None
    if chained is not None:
        assert chained.peak_bytes <= cap
        assert best.step_seconds <= chained.step_seconds * (1 + 1e-9)


@pytest.mark.parametrize("over", [1, 2, 3, 4])
def test_copies_spread_over_the_forward_hide_where_a_prefix_waits(over: int) -> None:
    """Copies take two forward layers each: retiring every other layer hides them all, while
    retiring consecutive layers makes the compute wait."""
    layers = tuple(LayerProfile(f"l{i}", 100, 100, 1.0, 2.0) for i in range(16))
    profile = StepProfile((*layers, LayerProfile("head", 5, 5, 1.0, 2.0)), 0, 50.0, 50.0)
    plan = plan_swaps(profile, profile.unconstrained_peak_bytes - 100 * over)
    assert plan.timeline.compute_wait_seconds == 0.0
    assert plan.predicted_step_seconds == unconstrained_seconds(profile)
