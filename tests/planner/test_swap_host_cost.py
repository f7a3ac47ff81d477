"""The host's time per swapped storage: a plan charges it on the compute stream, per layer's
storages, and the search prefers few large storages to many small ones moving the same bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightning_accudnn.planner import plan_swaps
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, StepProfile

HOST = (2e-3, 1e-3)  # seconds per swapped storage, forward and backward


def _layers(storages=(1, 3)):
    return (
        LayerProfile("a", 100, 100, 1.0, 2.0, swappable_storages=storages[0]),
        LayerProfile("b", 100, 100, 1.0, 2.0, swappable_storages=storages[1]),
    )


def test_a_swapped_layers_forward_and_backward_take_the_host_time_of_its_storages():
    profile = StepProfile(_layers(), 0, swap_host_seconds=HOST)
    plain = Simulator(replace(profile, swap_host_seconds=(0.0, 0.0)))
    charged = Simulator(profile)
    assert charged.charges_host and not plain.charges_host
    for swap, storages in (((False, False), 0), ((True, False), 1), ((False, True), 3), ((True, True), 4)):
        choice = PlanChoice(swap, 10**6, None)
        more = charged.times(choice).step_seconds - plain.times(choice).step_seconds
        assert more == pytest.approx(storages * sum(HOST))
    timeline = charged.timeline(PlanChoice((False, True), 10**6, None))
    row = timeline.layers[1]
    assert row.forward_end - row.forward_start == pytest.approx(1.0 + 3 * HOST[0])
    assert row.backward_end - row.backward_start == pytest.approx(2.0 + 3 * HOST[1])


def test_without_storage_counts_nothing_is_charged():
    profile = StepProfile(_layers(storages=(0, 0)), 0, swap_host_seconds=HOST)
    assert not Simulator(profile).charges_host


def _alternating(count: int) -> tuple[LayerProfile, ...]:
    """A deep narrow model's layers: a normalization saving its input and two statistics (3
    storages, 132 bytes), then an activation saving its output (1 storage, 128 bytes)."""
    layers = []
    for i in range(count):
        layers.append(LayerProfile(f"norm{i}", 132, 132, 1e-4, 2e-4, swappable_storages=3))
        layers.append(LayerProfile(f"relu{i}", 128, 128, 1e-4, 2e-4, swappable_storages=1))
    return tuple(layers)


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_the_search_swaps_few_storages_where_each_costs_the_host(share):
    layers = _alternating(40)
    plain = StepProfile(layers, 0, d2h_bytes_per_second=1e9, h2d_bytes_per_second=1e9)
    charged = replace(plain, swap_host_seconds=(1e-5, 1e-5))
    budget = round(plain.unconstrained_peak_bytes * (1 - share))
    chosen = plan_swaps(charged, budget)
    blind = plan_swaps(plain, budget)  # chosen as if a storage cost the host nothing
    assert chosen.predicted_peak_bytes <= budget
    blind_charged = Simulator(charged).times(
        PlanChoice(blind.swap, blind.prefetch_window_bytes, blind.max_copying_out_bytes)
    )
    assert chosen.predicted_step_seconds <= blind_charged.step_seconds
    needed = len(chosen.swapped_layers)
    assert chosen.swapped_storages <= needed + 3 * 2  # activations first: at most two normalizations
    assert chosen.lower_bound_seconds <= chosen.predicted_step_seconds
