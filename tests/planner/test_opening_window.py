"""What the prefetch window holds when the backward starts: the records the engine admits in
its prefetch order (``StepProfile.prefetch_order``), counted at every level above the highest
swapped layer instead of the whole window; a stale order is ignored; the largest window that
fits is found with it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, StepProfile

# Four swapped layers of 100 bytes (one record each), then a kept layer of 300.
LAYERS = tuple(LayerProfile(f"s{i}", 100, 100) for i in range(4)) + (LayerProfile("kept", 300, 300),)
ORDER = (("kept", 300, 300), *((f"s{i}", 100, 100) for i in (3, 2, 1, 0)))


def _simulator(order: tuple[tuple[str, int, int], ...]) -> Simulator:
    return Simulator(StepProfile(LAYERS, static_bytes=0, prefetch_order=order))


def test_the_levels_above_the_swapped_layers_hold_the_admitted_records_only():
    choice = PlanChoice((True,) * 4 + (False,), prefetch_window_bytes=150, max_copying_out_bytes=0)
    listed = _simulator(ORDER).memory(choice)
    unlisted = _simulator(()).memory(choice)
    # B_kept: its 300 bytes and s3's, which the copy-out FIFO left on the device; the engine's
    # window then holds s3 (first in the order), where it is, and nothing more (s2 would take it
    # to 200). Counted full, the window adds 150 retired bytes.
    assert listed.backward_levels[4] == 300 + 100 + 0
    assert unlisted.backward_levels[4] == 300 + 100 + 150
    assert listed.backward_levels[:4] == unlisted.backward_levels[:4]
    wider = PlanChoice((True,) * 4 + (False,), prefetch_window_bytes=250, max_copying_out_bytes=0)
    # s3 in the window where it is, s2 brought back: one copy of 100 bytes beside the levels' count
    assert _simulator(ORDER).memory(wider).backward_levels[4] == 300 + 100 + 100


def test_an_order_that_does_not_add_up_to_the_layers_is_not_used():
    stale = ORDER[1:]  # the kept layer's record missing: the profile was scaled or merged since
    choice = PlanChoice((True,) * 4 + (False,), prefetch_window_bytes=150, max_copying_out_bytes=0)
    assert _simulator(stale).memory(choice) == _simulator(()).memory(choice)


@st.composite
def listed_profiles(draw):
    count = draw(st.integers(1, 6))
    layers, records = [], []
    for i in range(count):
        sizes = draw(st.lists(st.integers(1, 50), min_size=1, max_size=3))
        kept = draw(st.integers(0, 40))
        layers.append(LayerProfile(f"l{i}", sum(sizes) + kept, sum(sizes)))
        records += [
            (f"l{i}", size, size if j == 0 or draw(st.booleans()) else 0) for j, size in enumerate(sizes)
        ]
    order = tuple(draw(st.permutations(records)))
    return StepProfile(tuple(layers), static_bytes=draw(st.integers(0, 50)), prefetch_order=order)


@settings(max_examples=300, deadline=None)
@given(listed_profiles(), st.data())
def test_the_largest_window_is_the_largest_that_fits(profile, data):
    simulator = Simulator(profile)
    swap = tuple(
        data.draw(st.lists(st.booleans(), min_size=len(profile.layers), max_size=len(profile.layers)))
    )
    limit = data.draw(st.sampled_from([None, 0, 30, 10**6]))
    peak = lambda window: simulator.peak_bytes(PlanChoice(swap, window, limit))  # noqa: E731
    assert all(
        peak(window) == simulator.memory(PlanChoice(swap, window, limit)).peak_bytes
        for window in (0, 40, 10**6)
    )
    cap = data.draw(st.integers(0, 600))
    largest = simulator.largest_window(swap, limit, cap)
    if largest is None:
        assert peak(0) > cap
        return
    assert peak(largest) <= cap
    unlisted = Simulator(replace(profile, prefetch_order=()))
    assert unlisted.largest_window(swap, limit, cap) in (None, *range(largest + 1))  # never more room
    assert peak(largest + 1) > cap or peak(10**9) <= cap


def test_below_the_highest_swapped_layer_one_record_alone_is_at_most_the_largest():
    """At window 0 the engine brings back one record at a time: while ``B_b`` runs it may hold
    one of ``a``'s alone, at most its 80-byte record, not the layer's 100 bytes."""
    layers = (LayerProfile("a", 100, 100), LayerProfile("b", 100, 100), LayerProfile("kept", 300, 300))
    order = (("kept", 300, 300), ("b", 100, 100), ("a", 80, 80), ("a", 20, 20))
    choice = PlanChoice((True, True, False), prefetch_window_bytes=0, max_copying_out_bytes=0)
    listed = Simulator(StepProfile(layers, static_bytes=0, prefetch_order=order)).memory(choice)
    unlisted = Simulator(StepProfile(layers, static_bytes=0)).memory(choice)
    # B_b: b where the copy-out FIFO left it (100), and a's record alone: 80 listed, 100 not
    assert listed.backward_levels[1] == 100 + 80
    assert unlisted.backward_levels[1] == 100 + 100
