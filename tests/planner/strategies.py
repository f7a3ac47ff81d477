"""Hypothesis strategies and an independent brute force for the planner tests."""

from __future__ import annotations

import itertools
import random

from hypothesis import strategies as st

from lightning_accudnn.planner import LayerProfile, StepProfile, simulate

INF = float("inf")


def split_bytes(total: int, rng: random.Random | None) -> list[int]:
    """``total`` bytes as a random list of positive storage sizes (one storage without ``rng``)."""
    if rng is None:
        return [total] if total else []
    parts, left = [], total
    while left > 0:
        size = rng.randint(1, left)
        parts.append(size)
        left -= size
    return parts


# Multiples of 0.5 keep the float arithmetic exact, so real ties (and zero times) happen often.
_seconds = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
_bandwidth = st.sampled_from([INF, 25.0, 50.0, 100.0, 400.0])


@st.composite
def layers(draw, index: int) -> LayerProfile:
    saved = draw(st.integers(0, 100))
    swappable = draw(st.one_of(st.just(saved), st.integers(0, saved)))
    return LayerProfile(f"layer{index}", saved, swappable, draw(_seconds), draw(_seconds))


@st.composite
def profiles(draw, min_layers: int = 0, max_layers: int = 7) -> StepProfile:
    count = draw(st.integers(min_layers, max_layers))
    return StepProfile(
        layers=tuple(draw(layers(i)) for i in range(count)),
        static_bytes=draw(st.integers(0, 50)),
        d2h_bytes_per_second=draw(_bandwidth),
        h2d_bytes_per_second=draw(_bandwidth),
    )


def run_sums(profile: StepProfile, swap: tuple[bool, ...]) -> set[int]:
    """0 and the sums of contiguous runs of swapped layers' swappable bytes, plus one value
    larger than everything (written out here, independently of the planner). Every limit and
    every window the planner may choose behaves like one of these in time."""
    sizes = [
        layer.swappable_bytes
        for layer, s in zip(profile.layers, swap, strict=True)
        if s and layer.swappable_bytes
    ]
    sums = {0, 10**12}
    for first in range(len(sizes)):
        for last in range(first, len(sizes)):
            sums.add(sum(sizes[first : last + 1]))
    return sums


def brute_force(profile: StepProfile, cap: int) -> tuple[float | None, int]:
    """(least predicted step time of any plan with peak <= cap or None, least peak of any plan),
    over every swap set x limit x window."""
    best_time, least_peak = None, None
    for swap in itertools.product((False, True), repeat=len(profile.layers)):
        if any(s and not layer.swappable_bytes for s, layer in zip(swap, profile.layers, strict=True)):
            continue  # simulated as kept: the same as another swap set (tested on its own)
        sums = run_sums(profile, swap)
        for limit in [*sums, None]:
            for window in sums:
                timeline = simulate(profile, swap, window, limit)
                if least_peak is None or timeline.peak_bytes < least_peak:
                    least_peak = timeline.peak_bytes
                if timeline.peak_bytes <= cap and (best_time is None or timeline.step_seconds < best_time):
                    best_time = timeline.step_seconds
    return best_time, least_peak
