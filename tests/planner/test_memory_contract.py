"""The planner's predicted peak bounds the engine/planner memory contract, storage by storage.

``contract_ledger_peak`` is an independent reference of what an engine that follows the
contract (docs/design.md) holds on the device in issue order, written per storage: layers' bytes
split into storages at random, storages pushed to the in-flight FIFO and retired whole,
backward reading a layer's storages in a random order, prefetching before every read, one
storage always allowed in the window. Whatever the split and the order, the planner's peak
must be at least the reference's, and it must not depend on timings.
"""

from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner import LayerProfile, StepProfile, plan_swaps
from lightning_accudnn.planner.plan import BudgetTooSmallError, min_budget_bytes
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from tests.planner.strategies import profiles, split_bytes


def contract_ledger_peak(
    profile: StepProfile,
    swap: list[bool],
    window: int,
    limit: int | None,
    rng: random.Random,
    whole_layers: bool = False,
) -> int:
    level = peak = profile.static_bytes
    fifo: deque[tuple[int, int]] = deque()  # (storage id, bytes), oldest first
    fifo_bytes = 0
    sizes: dict[int, int] = {}
    layer_items: list[list[int]] = []  # storage ids per layer
    swapped_ids: set[int] = set()
    pushed: list[int] = []  # swapped storages in push order
    for i, layer in enumerate(profile.layers):
        items = []
        swapped = swap[i] and layer.swappable_bytes > 0
        split = None if whole_layers else rng
        blocks = [(size, swapped) for size in split_bytes(layer.swappable_bytes, split)]
        blocks += [(size, False) for size in split_bytes(layer.resident_bytes, split)]
        rng.shuffle(blocks)
        for size, is_swapped in blocks:
            sid = len(sizes)
            sizes[sid] = size
            items.append(sid)
            level += size
            peak = max(peak, level)
            if is_swapped:
                swapped_ids.add(sid)
                pushed.append(sid)
                fifo.append((sid, size))
                fifo_bytes += size
                while limit is not None and fifo_bytes > limit and len(fifo) > 1:
                    _, retired = fifo.popleft()
                    fifo_bytes -= retired
                    level -= retired
        layer_items.append(items)
    leftovers = {sid for sid, _ in fifo}
    on_host = [sid for sid in pushed if sid not in leftovers]  # retired: must come back
    order = on_host[::-1]
    fetched: set[int] = set()
    used = 0
    position = 0

    def prefetch() -> None:
        nonlocal position, used, level, peak
        while position < len(order):
            sid = order[position]
            if sid in fetched:
                position += 1
                continue
            if used > 0 and used + sizes[sid] > window:
                return
            fetched.add(sid)
            used += sizes[sid]
            level += sizes[sid]
            peak = max(peak, level)
            position += 1

    for i in range(len(profile.layers) - 1, -1, -1):
        items = list(layer_items[i])
        rng.shuffle(items)
        for sid in items:
            prefetch()
            if sid in swapped_ids and sid not in leftovers and sid not in fetched:
                fetched.add(sid)  # read before the prefetch got to it: fetched on demand
                used += sizes[sid]
                level += sizes[sid]
                peak = max(peak, level)
            level -= sizes[sid]
            if sid in fetched:
                used -= sizes[sid]
        prefetch()
    return peak


@settings(max_examples=300, deadline=None)
@given(
    profiles(max_layers=8),
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.integers(0, 300),
    st.one_of(st.none(), st.integers(0, 300)),
    st.integers(0, 2**32),
)
def test_predicted_peak_bounds_the_contract_at_every_split_and_order(profile, swap, window, limit, seed):
    swap = swap[: len(profile.layers)]
    predicted = Simulator(profile).memory(PlanChoice(tuple(swap), window, limit)).peak_bytes
    rng = random.Random(seed)
    for _ in range(5):
        assert contract_ledger_peak(profile, swap, window, limit, rng) <= predicted


def test_one_storage_per_layer_in_layer_order_is_exact():
    """With one storage per layer and a fixed order, the reference meets the bound exactly here:
    a: 100, b: 30, c: 50 all swapped, limit 60, window 0, M = 0 (hand count in test_timeline)."""
    profile = StepProfile(
        (LayerProfile("a", 100, 100), LayerProfile("b", 30, 30), LayerProfile("c", 50, 50)), static_bytes=0
    )
    predicted = Simulator(profile).memory(PlanChoice((True, True, True), 0, 60)).peak_bytes
    assert predicted == 130
    assert contract_ledger_peak(profile, [True] * 3, 0, 60, random.Random(0), whole_layers=True) == 130


_times = st.sampled_from([0.0, 0.5, 1.0, 3.0])
_bandwidths = st.sampled_from([float("inf"), 10.0, 100.0])


@st.composite
def retimed(draw, profile: StepProfile) -> StepProfile:
    """The same bytes with other timings and bandwidths (a loaded machine, another GPU)."""
    layers = tuple(
        LayerProfile(layer.name, layer.saved_bytes, layer.swappable_bytes, draw(_times), draw(_times))
        for layer in profile.layers
    )
    return StepProfile(layers, profile.static_bytes, draw(_bandwidths), draw(_bandwidths))


@settings(max_examples=80, deadline=None)
@given(st.data(), profiles(max_layers=14), st.integers(0, 60), st.sampled_from([0, 7]))
def test_any_budget_from_the_named_smallest_plans_whatever_the_timings(data, profile, extra, reserve):
    """The smallest budget is one number per profile's bytes: timings and the asked budget
    change neither it nor the predicted peak of a plan."""
    smallest = min_budget_bytes(profile, reserve)
    other = data.draw(retimed(profile))
    assert min_budget_bytes(other, reserve) == smallest
    for candidate in (profile, other):
        plan = plan_swaps(candidate, smallest + extra, reserve)
        assert plan.predicted_peak_bytes <= smallest + extra - reserve
        assert plan.min_budget_bytes == smallest
        # The same plan under other timings: the same predicted peak.
        choice = PlanChoice(plan.swap, plan.prefetch_window_bytes, plan.max_copying_out_bytes)
        for timed in (profile, other):
            assert Simulator(timed).memory(choice).peak_bytes == plan.predicted_peak_bytes
    if smallest - reserve > profile.static_bytes:
        asked = data.draw(st.integers(reserve, smallest - 1))
        try:
            plan_swaps(other, asked, reserve)
        except BudgetTooSmallError as error:
            assert error.min_budget_bytes == smallest
        else:
            raise AssertionError(f"a budget of {asked} below the smallest {smallest} planned")
