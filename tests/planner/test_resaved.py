"""Storages saved again by a later layer: the engine brings them back for
the last save and frees them after the first saver's backward; the planner's peak must bound it.

The model below is the smallest case: ``a`` saves ``x``, ``e`` saves a small storage of its own
(which pushes ``x`` out of the in-flight FIFO under a copy-out limit of 0), ``b`` saves ``h``, and
``c`` saves ``x`` again. In backward the engine brings ``x`` back for ``c`` and holds it until
``a``'s backward ends, so ``x`` and ``h`` are on the device together while ``b`` runs backward.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from lightning_accudnn.ops.engine import OffloadEngine
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.planner import LayerProfile, StepProfile, min_budget_bytes
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from tests.planner.strategies import split_bytes


class _SavesInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x)


class _SavesASmallCopy(nn.Module):
    def __init__(self, elements: int) -> None:
        super().__init__()
        self.elements = elements

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.sin(h[: self.elements].clone()).sum() * 0


class _SavesXAgain(nn.Module):
    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return y + torch.sin(x)


class _Resaving(nn.Module):
    def __init__(self, small: int) -> None:
        super().__init__()
        self.a, self.e, self.b, self.c = _SavesInput(), _SavesASmallCopy(small), _SavesInput(), _SavesXAgain()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.e(self.a(x))), x)


def _run(elements: int, small: int, window: int, limit: int | None) -> tuple[StepProfile, int]:
    """The engine's profile of one step (swap everything) and its ledger's peak."""
    model = _Resaving(small)
    x = torch.randn(elements, requires_grad=True)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.swap_everything(window, limit)):
        loss = model(x.clone()).sum()
    loss.backward()
    stats = engine.end_step()
    engine.close()
    assert stats is not None
    return StepProfile(stats.layers, static_bytes=0), stats.ledger_peak_bytes


def _with_resaves(profile: StepProfile) -> StepProfile:
    """What the engine must report: ``x``'s bytes, first saved by ``a``, are last saved
    by ``c``, which is listed with no bytes of its own."""
    a, e, b = profile.layers
    assert (a.name, e.name, b.name) == ("a", "e", "b")
    return StepProfile(
        (dataclasses.replace(a, resaved_by=(("c", a.swappable_bytes),)), e, b, LayerProfile("c", 0, 0)),
        static_bytes=0,
    )


def test_the_engine_reports_the_resave_without_which_the_planner_undercounts_it():
    profile, ledger_peak = _run(1024, small=1, window=0, limit=0)
    # c saves nothing of its own, so x is counted back from the backward of b, the layer before.
    assert profile.layers[0].resaved_by == (("b", 4096),)
    choice = PlanChoice((True, True, True), 0, 0)
    assert Simulator(profile).memory(choice).peak_bytes >= ledger_peak
    unannotated = StepProfile(
        tuple(dataclasses.replace(layer, resaved_by=()) for layer in profile.layers), static_bytes=0
    )
    predicted = Simulator(unannotated).memory(choice).peak_bytes
    assert (predicted, ledger_peak) == (4100, 8192)  # x (4096) and h (4096) held together in B_b
    annotated = _with_resaves(profile)
    assert Simulator(annotated).memory(PlanChoice((True,) * 4, 0, 0)).peak_bytes >= ledger_peak
    assert min_budget_bytes(annotated) >= ledger_peak


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 2048),
    st.integers(1, 64),
    st.sampled_from([0, 4, 4096, 2**20]),
    st.sampled_from([None, 0, 4, 4096, 2**20]),
)
def test_with_the_resave_the_planner_bounds_the_engine(elements, small, window, limit):
    small = min(small, elements)
    profile, ledger_peak = _run(elements, small, window, limit)
    annotated = _with_resaves(profile)
    choice = PlanChoice((True,) * len(annotated.layers), window, limit)
    assert Simulator(annotated).memory(choice).peak_bytes >= ledger_peak


def test_a_resave_must_name_a_layer_of_the_profile_at_or_after_the_saver():
    import pytest

    with pytest.raises(ValueError, match="not this layer or a later layer"):
        StepProfile((LayerProfile("a", 10, 10, resaved_by=(("b", 10),)),), static_bytes=0)
    with pytest.raises(ValueError, match="summing to at most swappable_bytes"):
        LayerProfile("a", 10, 5, resaved_by=(("b", 10),))
    same = StepProfile((LayerProfile("a", 10, 10, resaved_by=(("a", 10),)),), static_bytes=0)
    plain = StepProfile((LayerProfile("a", 10, 10),), static_bytes=0)
    assert Simulator(same).peak_bytes(PlanChoice((True,), 0, 0)) == Simulator(plain).peak_bytes(
        PlanChoice((True,), 0, 0)
    )


@st.composite
def _resaving_profiles(draw) -> StepProfile:
    count = draw(st.integers(1, 6))
    sizes = [draw(st.integers(0, 100)) for _ in range(count)]
    layers = []
    for i, saved in enumerate(sizes):
        swappable = draw(st.integers(0, saved))
        resaved: list[tuple[str, int]] = []
        left = swappable
        for later in range(i + 1, count):
            if left and draw(st.booleans()):
                nbytes = draw(st.integers(1, left))
                resaved.append((f"l{later}", nbytes))
                left -= nbytes
        layers.append(LayerProfile(f"l{i}", saved, swappable, 1.0, 1.0, resaved_by=tuple(resaved)))
    return StepProfile(tuple(layers), static_bytes=draw(st.integers(0, 20)))


@settings(max_examples=300, deadline=None)
@given(_resaving_profiles(), st.data())
def test_with_resaves_the_peak_never_grows_when_more_is_swapped_or_limits_shrink(profile, data):
    """The facts the search relies on hold with re-saved storages: swapping a layer, a smaller
    copy-out limit or window never raise the peak, so the least peak is swap everything, 0, 0."""
    k = len(profile.layers)
    simulator = Simulator(profile)
    swap = tuple(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    window, limit = data.draw(st.integers(0, 300)), data.draw(st.integers(0, 300))
    peak = simulator.peak_bytes(PlanChoice(swap, window, limit))
    assert peak == simulator.memory(PlanChoice(swap, window, limit)).peak_bytes
    more = tuple(s or data.draw(st.booleans()) for s in swap)
    assert simulator.peak_bytes(PlanChoice(more, window, limit)) <= peak
    assert simulator.peak_bytes(PlanChoice(swap, data.draw(st.integers(0, window)), limit)) <= peak
    assert simulator.peak_bytes(PlanChoice(swap, window, data.draw(st.integers(0, limit)))) <= peak
    least = simulator.peak_bytes(PlanChoice(simulator.swap_everything(), 0, 0))
    assert least <= peak and least == min_budget_bytes(profile)
    simulator.timeline(PlanChoice(swap, window, limit))  # the time model runs with re-saves


def _reference_peak_with_resaves(
    profile: StepProfile,
    swap: tuple[bool, ...],
    window: int,
    limit: int | None,
    rng: random.Random,
    whole: bool = False,
) -> int:
    """The contract (HELPERS.md) written per storage, independently of the planner: layers' bytes
    split into storages at random (one storage per part with ``whole``), re-saved storages
    brought back in the order of their last save and freed after their first layer's backward,
    reads in random order, prefetch before each. A swapped storage still in the copy-out FIFO
    when backward starts is used where it is, and enters the prefetch window like one brought
    back (the engine's ``_fetch`` counts it there until it is freed), without new bytes."""
    index = {layer.name: i for i, layer in enumerate(profile.layers)}
    level = peak = profile.static_bytes
    size: list[int] = []
    first: list[int] = []
    last: list[int] = []
    swapped: list[bool] = []
    fifo: deque[int] = deque()
    fifo_bytes = 0
    for i, layer in enumerate(profile.layers):
        is_swapped = swap[i] and layer.swappable_bytes > 0
        parts = [(nbytes, index[later]) for later, nbytes in layer.resaved_by]
        parts.append((layer.swappable_bytes - sum(nbytes for _, nbytes in layer.resaved_by), i))
        blocks = [
            (piece, at, is_swapped)
            for nbytes, at in parts
            for piece in split_bytes(nbytes, None if whole else rng)
        ]
        blocks += [(piece, i, False) for piece in split_bytes(layer.resident_bytes, None if whole else rng)]
        rng.shuffle(blocks)
        for piece, at, moves in blocks:
            sid = len(size)
            size.append(piece)
            first.append(i)
            last.append(at)
            swapped.append(moves)
            level += piece
            peak = max(peak, level)
            if moves:
                fifo.append(sid)
                fifo_bytes += piece
                while limit is not None and fifo_bytes > limit and len(fifo) > 1:
                    oldest = fifo.popleft()
                    fifo_bytes -= size[oldest]
                    level -= size[oldest]
    on_device = set(fifo)  # still in the FIFO: read in place, no copy back
    on_host = {sid for sid in range(len(size)) if swapped[sid] and sid not in on_device}
    order = []
    for position in range(len(profile.layers) - 1, -1, -1):
        here = [sid for sid in on_host | on_device if last[sid] == position]
        rng.shuffle(here)
        order += here
    fetched: set[int] = set()
    used = 0
    cursor = 0

    def prefetch() -> None:
        nonlocal cursor, used, level, peak
        while cursor < len(order):
            sid = order[cursor]
            if sid in fetched:
                cursor += 1
                continue
            if used > 0 and used + size[sid] > window:
                return
            fetched.add(sid)
            used += size[sid]
            if sid not in on_device:
                level += size[sid]
                peak = max(peak, level)
            cursor += 1

    freed: set[int] = set()
    for i in range(len(profile.layers) - 1, -1, -1):
        reads = [(sid, False) for sid in range(len(size)) if last[sid] == i and first[sid] != i]
        reads += [(sid, True) for sid in range(len(size)) if first[sid] == i]
        rng.shuffle(reads)
        for sid, frees in reads:
            prefetch()
            if (sid in on_host or sid in on_device) and sid not in fetched:
                fetched.add(sid)  # read before the prefetch got to it: fetched on demand
                used += size[sid]
                if sid not in on_device:
                    level += size[sid]
                    peak = max(peak, level)
            if frees and sid not in freed:
                freed.add(sid)
                level -= size[sid]
                if sid in fetched:
                    used -= size[sid]
        prefetch()
    return peak


@settings(max_examples=300, deadline=None)
@given(_resaving_profiles(), st.data(), st.integers(0, 2**32))
def test_the_predicted_peak_bounds_the_contract_with_resaves_at_every_split_and_order(profile, data, seed):
    k = len(profile.layers)
    swap = tuple(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    window = data.draw(st.integers(0, 300))
    limit = data.draw(st.one_of(st.none(), st.integers(0, 300)))
    predicted = Simulator(profile).memory(PlanChoice(swap, window, limit)).peak_bytes
    rng = random.Random(seed)
    for _ in range(5):
        whole = rng.random() < 0.5
        assert _reference_peak_with_resaves(profile, swap, window, limit, rng, whole) <= predicted


def test_the_reference_meets_the_engine_on_the_counterexample():
    """The per-storage reference holds x and h together in B_b, as the engine did (8192 bytes);
    the planner bounds it only when told that c saves x again."""
    layers = (LayerProfile("a", 4096, 4096), LayerProfile("e", 4, 4), LayerProfile("b", 4096, 4096))
    plain = StepProfile(layers, static_bytes=0)
    annotated = _with_resaves(plain)
    reference = max(
        _reference_peak_with_resaves(annotated, (True,) * 4, 0, 0, random.Random(seed), whole=True)
        for seed in range(20)
    )
    assert reference == 8192
    assert Simulator(plain).memory(PlanChoice((True,) * 3, 0, 0)).peak_bytes == 4100
    assert Simulator(annotated).memory(PlanChoice((True,) * 4, 0, 0)).peak_bytes >= reference


@settings(max_examples=300, deadline=None)
@given(_resaving_profiles(), st.data())
def test_with_resaves_every_retired_byte_is_copied_back_in_the_predicted_step(profile, data):
    """Re-saved bytes held in the prefetch window until their first saver's backward can fill it;
    the copies a backward reads still come in before it runs, so on one copy stream the step
    takes at least every swapped byte's copy out and every retired byte's copy back."""
    profile = dataclasses.replace(profile, d2h_bytes_per_second=1.0, h2d_bytes_per_second=1.0)
    k = len(profile.layers)
    simulator = Simulator(profile)
    swap = simulator.effective(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    window = data.draw(st.integers(0, 150))
    limit = data.draw(st.integers(0, 150))
    timeline = simulator.timeline(PlanChoice(swap, window, limit))
    step = timeline.step_seconds
    out = sum(layer.swappable_bytes for layer, swapped in zip(profile.layers, swap, strict=True) if swapped)
    retired = [timing.retired for timing in timeline.layers]
    back = sum(layer.swappable_bytes for layer, went in zip(profile.layers, retired, strict=True) if went)
    assert step >= out + back - 1e-9, (step, out, back)
