"""The recompute frontier: for each amount of bytes freed, the cheapest non-overlapping set."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner.frontier import (
    fitting_set,
    freed_bytes,
    recompute_cost_lines,
    recompute_frontier,
)
from lightning_accudnn.planner.recompute import SegmentSpan


@st.composite
def nested_spans(draw) -> tuple[list[SegmentSpan], int]:
    """Stages of blocks of layers, the stages and the blocks both candidates (nested)."""
    spans, layer = [], 0
    for stage in range(draw(st.integers(1, 3))):
        first = layer
        blocks = []
        for block in range(draw(st.integers(1, 3))):
            width = draw(st.integers(1, 3))
            saved = draw(st.integers(0, 200))
            seconds = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))
            blocks.append(SegmentSpan(f"s{stage}.b{block}", layer, layer + width - 1, 20, saved, seconds, 10))
            layer += width
        if draw(st.booleans()):
            saved = sum(block.saved_bytes for block in blocks) + draw(st.integers(0, 50))
            seconds = sum(block.forward_seconds for block in blocks)
            spans.append(SegmentSpan(f"s{stage}", first, layer - 1, 20, saved, seconds, 10))
        spans.extend(blocks)
        layer += draw(st.integers(0, 1))  # a layer between stages, in no candidate
    return spans, layer


def _units(span: SegmentSpan, unit: int) -> int:
    return freed_bytes(span) // unit


@settings(max_examples=80, deadline=None)
@given(nested_spans(), st.sampled_from([4, 16, 128]))
def test_each_amount_gets_the_cheapest_set_written_without_the_dp(case, resolution):
    spans, layers = case
    frontier = recompute_frontier(spans, layers, resolution=resolution)
    assert frontier[0] == ()
    for chosen in frontier:  # never two overlapping candidates (a stage and its block)
        assert all(not a.overlaps(b) for a, b in itertools.combinations(chosen, 2))
    useful = [span for span in spans if freed_bytes(span) > 0]
    if not useful:
        assert frontier == [()]
        return
    sets = [
        chosen
        for size in range(len(useful) + 1)
        for chosen in itertools.combinations(useful, size)
        if all(not a.overlaps(b) for a, b in itertools.combinations(chosen, 2))
    ]
    most = max(sum(freed_bytes(span) for span in chosen) for chosen in sets)
    unit = max(1, math.ceil(most / resolution))
    top = max(1, most // unit)
    for amount in range(top + 1):  # the least seconds for at least that many units (capped)
        reaching = [
            sum(span.forward_seconds for span in chosen)
            for chosen in sets
            if min(top, sum(_units(span, unit) for span in chosen)) >= amount
        ]
        if not reaching:
            continue
        found = [
            sum(span.forward_seconds for span in chosen)
            for chosen in frontier
            if min(top, sum(_units(span, unit) for span in chosen)) >= amount
        ]
        assert found and min(found) == min(reaching)
    # the most freeing set of the frontier frees as much as any set, in the frontier's units
    assert sum(_units(span, unit) for span in frontier[-1]) >= min(
        top, max(sum(_units(span, unit) for span in chosen) for chosen in sets)
    )


def _fractional(spans: list[SegmentSpan], freed: float) -> float:
    """The fractional knapsack without the overlap constraint (the bound's former form)."""
    seconds = 0.0
    for span in sorted(spans, key=lambda span: span.forward_seconds / span.freed_bytes):
        take = min(freed, span.freed_bytes)
        seconds += span.forward_seconds * take / span.freed_bytes
        freed -= take
        if freed <= 0:
            return seconds
    return math.inf


@settings(max_examples=80, deadline=None)
@given(nested_spans(), st.lists(st.integers(1, 1200), min_size=1, max_size=6))
def test_the_recompute_cost_bound_lies_between_the_relaxation_and_every_set(case, amounts):
    spans, _ = case
    useful = [span for span in spans if span.freed_bytes > 0]
    lines, most = recompute_cost_lines(spans)
    sets = [
        chosen
        for size in range(len(useful) + 1)
        for chosen in itertools.combinations(useful, size)
        if all(not a.overlaps(b) for a, b in itertools.combinations(chosen, 2))
    ]
    assert most == max(sum(span.freed_bytes for span in chosen) for chosen in sets)
    for amount in amounts:
        if amount > most:
            continue
        bound = max(slope * amount + intercept for slope, intercept in lines)
        least = min(
            sum(span.forward_seconds for span in chosen)
            for chosen in sets
            if sum(span.freed_bytes for span in chosen) >= amount
        )
        assert bound <= least + 1e-9
        assert bound >= _fractional(useful, amount) - 1e-9


def _held_walk(chosen: tuple[SegmentSpan, ...], saved: list[int], available: int) -> bool:
    """Whether ``chosen`` fits ``available`` by the reduction, walked layer by layer: a kept
    layer holds its bytes, a recomputed span its inputs, the outputs of a recomputed span are
    held once more after it, and each span's rebuilt saves must fit on top of what is held."""
    starts = {span.first: span for span in chosen}
    held, before, layer = 0, None, 0
    while layer < len(saved):
        outputs = before.output_bytes if before is not None else 0
        span = starts.get(layer)
        if span is None:
            held += outputs + saved[layer]
            before, layer = None, layer + 1
            continue
        held += outputs + span.held_bytes
        if held + span.saved_bytes > available:
            return False
        before, layer = span, span.last + 1
    return held <= available


@settings(max_examples=80, deadline=None)
@given(nested_spans(), st.data())
def test_the_fitting_set_is_the_cheapest_that_fits_written_without_the_dp(case, data):
    spans, layers = case
    saved = [data.draw(st.integers(0, 80)) for _ in range(layers)]
    spans = [replace(span, saved_bytes=sum(saved[span.first : span.last + 1])) for span in spans]
    available = data.draw(st.integers(0, sum(saved) + 20))
    useful = [span for span in spans if span.freed_bytes > 0]
    feasible = [
        chosen
        for size in range(len(useful) + 1)
        for chosen in itertools.combinations(useful, size)
        if all(not a.overlaps(b) for a, b in itertools.combinations(chosen, 2))
        and _held_walk(chosen, saved, available)
    ]
    found = fitting_set(spans, saved, available, resolution=max(1, available))  # exact bytes
    if not feasible:
        assert found is None
        return
    assert found is not None and _held_walk(found, saved, available)
    assert all(not a.overlaps(b) for a, b in itertools.combinations(found, 2))
    least = min(sum(span.recompute_seconds for span in chosen) for chosen in feasible)
    assert sum(span.recompute_seconds for span in found) == least
