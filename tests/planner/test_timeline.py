"""The simulator: hand-computed memory (issue order) and timelines, and properties of its rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner import LayerProfile, StepProfile, prefetch_window_candidates, simulate
from lightning_accudnn.planner.timeline import PlanChoice, Simulator, limit_candidates
from tests.planner.strategies import INF, profiles


def _times(timeline, name):
    return next(layer for layer in timeline.layers if layer.name == name)


def test_two_swapped_layers_slow_link():
    """a, b: 100 B each, all swappable, F = B = 1 s, 50 B/s both ways (a copy takes 2 s), M = 0.

    Memory, limit 0: F_a 100; a pushed. F_b: a in flight + b = 200; b pushed, the FIFO holds
    200 > 0 bytes in two entries: a is retired. b stays in the FIFO to the end of forward.
    Backward: during B_b, b (100) + one storage of a may come back (100) = 200; B_a 100.
    Time: F_a [0,1], out_a [1,3]; F_b [1,2], out_b [3,5]; retiring a waits for out_a: 2..3.
    At 3 b, read where it is, takes its 100 B in the window, and compute waits for out_b until
    5; the window of 0 B admits nothing more. B_b [5,6]; b leaves the window, a is prefetched
    at 6, copy in [6,8]; B_a waits for it: [8,9]. Step 9 s, compute waited 1 + 2 + 2 = 5 s.
    """
    profile = StepProfile(
        (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        static_bytes=0,
        d2h_bytes_per_second=50.0,
        h2d_bytes_per_second=50.0,
    )
    timeline = simulate(profile, [True, True], 0, max_copying_out_bytes=0)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.peak_layer) == (200, "forward", "b")
    assert timeline.memory.forward_levels == (100, 200)
    assert timeline.memory.backward_levels == (100, 200)
    assert (timeline.step_seconds, timeline.compute_wait_seconds, timeline.forward_seconds) == (9.0, 5.0, 3.0)
    a, b = _times(timeline, "a"), _times(timeline, "b")
    assert (a.copy_out_start, a.copy_out_end, b.copy_out_start, b.copy_out_end) == (1.0, 3.0, 3.0, 5.0)
    assert (a.retired, b.retired) == (True, False)
    assert (b.prefetch_start, b.copy_in_start, b.copy_in_end) == (None, None, None)
    assert (b.backward_start, b.backward_end) == (5.0, 6.0)
    assert (a.prefetch_start, a.copy_in_start, a.copy_in_end) == (6.0, 6.0, 8.0)
    assert (a.backward_start, a.backward_end) == (8.0, 9.0)
    # A window with room for both: a is prefetched at 3, its copy in waits for the stream: [5,7];
    # B_b [5,6], B_a waits for the copy until 7: [7,8]. Step 8 s, waited 1 + 2 + 1 = 4 s.
    wide = simulate(profile, [True, True], 200, max_copying_out_bytes=0)
    assert (wide.step_seconds, wide.compute_wait_seconds) == (8.0, 4.0)
    a = _times(wide, "a")
    assert (a.prefetch_start, a.copy_in_start, a.copy_in_end, a.backward_start) == (3.0, 5.0, 7.0, 7.0)

    # No limit: nothing is retired, both are used in place. The forward ends at 2; b takes the
    # window, compute waits for out_b until 5: B_b [5,6]; a is admitted then (out_a ended at
    # 3): B_a [6,7]. Step 7 s, waited 3 s.
    unlimited = simulate(profile, [True, True], 0)
    assert (unlimited.forward_seconds, unlimited.step_seconds, unlimited.compute_wait_seconds) == (
        2.0,
        7.0,
        3.0,
    )
    assert unlimited.peak_bytes == 200 and not any(layer.retired for layer in unlimited.layers)


def test_partial_retirement_takes_the_worst_storage_split():
    """a: 100, b: 30, c: 50, all swapped, limit 60, M = 0, zero times, free copies.

    The planner does not know the storages, so older FIFO entries retire byte by byte and the
    newest counts as one storage. F_a 100; a pushed (alone: stays). F_b: 100 + 30 = 130; b
    pushed: 130 > 60, 70 of a retire (a: 30, b: 30). F_c: 60 + 50 = 110; c pushed: 110 > 60:
    a's 30 retire, then 20 of b (b: 10, c: 50). Retired R = (100, 20, 0), left (0, 10, 50).
    Backward with window 0, while B_i runs: M + sum_{j<=i} (S_j - R_j) + max(R_i, R_next,
    min(w, sum_{j<=i} R_j)): B_c 60 + max(0, 20, 0) = 80; B_b 10 + max(20, 100, 0) = 110;
    B_a 0 + 100 = 100. Window 120: B_c 60 + 120 = 180, B_b 10 + 120 = 130.
    """
    profile = StepProfile(
        (LayerProfile("a", 100, 100), LayerProfile("b", 30, 30), LayerProfile("c", 50, 50)), static_bytes=0
    )
    narrow = simulate(profile, [True] * 3, 0, max_copying_out_bytes=60)
    assert narrow.memory.forward_levels == (100, 130, 110)
    assert narrow.memory.backward_levels == (100, 110, 80)
    assert (narrow.peak_bytes, narrow.peak_event, narrow.peak_layer) == (130, "forward", "b")
    wide = simulate(profile, [True] * 3, 120, max_copying_out_bytes=60)
    assert wide.memory.backward_levels == (100, 130, 180)
    assert (wide.peak_bytes, wide.peak_event, wide.peak_layer) == (180, "backward", "c")
    # The time model retires whole layers: a when b is pushed, b when c is.
    assert [layer.retired for layer in narrow.layers] == [True, True, False]


def test_one_storage_may_come_back_at_the_start_of_backward():
    """M = 1000; a: 100 saved (60 swappable), b: 50 (all), c: 80 (none); swap a and b, limit 0.

    Forward: F_a 1100; F_b 1040 + 60 (a in flight) + 50 = 1150; b's push retires a;
    F_c 1040 + 50 (b in flight) + 80 = 1170. b stays in the FIFO. The window holds nothing
    when backward starts, so one storage of a may come back at once, even with window 0:
    during B_c 1000 + 40 + 50 + 80 + 60 = 1230, as much as swapping nothing.
    """
    profile = StepProfile(
        (LayerProfile("a", 100, 60), LayerProfile("b", 50, 50), LayerProfile("c", 80, 0)), static_bytes=1000
    )
    timeline = simulate(profile, [True, True, False], 0, max_copying_out_bytes=0)
    assert timeline.memory.forward_levels == (1100, 1150, 1170)
    assert timeline.memory.backward_levels == (1100, 1150, 1230)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.peak_layer) == (1230, "backward", "c")
    assert simulate(profile, [False] * 3, 0).peak_bytes == profile.unconstrained_peak_bytes == 1230


def test_kept_layer_between_swapped_ones():
    """M = 0; a: 100 swappable, b: 100 kept (nothing swappable), c: 100 swappable; F = B = 1 s,
    50 B/s (each copy 2 s). Swap a and c, limit 0, window 100.

    Memory: F_a 100; F_b 100 (a in flight) + 100 = 200; F_c 100 (b) + 100 (a) + 100 = 300;
    c's push retires a. Backward: B_c 200 + 100 (a may come back) = 300; B_b 200; B_a 100.
    Time: F_a [0,1] out_a [1,3]; F_b [1,2]; F_c [2,3] out_c [3,5]; retiring a needs no wait
    (out_a ended at 3). At 3 c, read where it is, fills the window (100 B), and compute waits
    for out_c to 5: B_c [5,6]. c leaves the window: a prefetched at 6, copy in [6,8]. B_b
    [6,7]; B_a waits to 8, runs [8,9]. Step 9 s, waited 2 + 1 = 3 s.
    """
    profile = StepProfile(
        (
            LayerProfile("a", 100, 100, 1.0, 1.0),
            LayerProfile("b", 100, 0, 1.0, 1.0),
            LayerProfile("c", 100, 100, 1.0, 1.0),
        ),
        static_bytes=0,
        d2h_bytes_per_second=50.0,
        h2d_bytes_per_second=50.0,
    )
    timeline = simulate(profile, [True, False, True], 100, max_copying_out_bytes=0)
    assert timeline.memory.forward_levels == (100, 200, 300)
    assert timeline.memory.backward_levels == (100, 200, 300)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.peak_layer) == (300, "forward", "c")
    assert (timeline.step_seconds, timeline.compute_wait_seconds) == (9.0, 3.0)
    a, b, c = (_times(timeline, name) for name in "abc")
    assert (c.copy_out_start, c.copy_out_end, c.retired, c.prefetch_start) == (3.0, 5.0, False, None)
    assert (c.backward_start, b.backward_start, b.backward_end) == (5.0, 6.0, 7.0)
    assert (a.prefetch_start, a.copy_in_start, a.copy_in_end) == (6.0, 6.0, 8.0)
    assert (a.backward_start, a.backward_end) == (8.0, 9.0)
    assert b.copy_out_start is None and b.prefetch_start is None and not b.swapped


def test_memory_curve_follows_the_levels():
    profile = StepProfile(
        (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 50, 50, 1.0, 1.0)),
        static_bytes=10,
        d2h_bytes_per_second=200.0,
        h2d_bytes_per_second=200.0,
    )
    timeline = simulate(profile, [True, False], 0, max_copying_out_bytes=0)
    times, values = timeline.memory_curve()
    assert max(values) == timeline.peak_bytes
    assert values[-1] == 10  # only static memory after the step
    assert times == sorted(times)
    assert all(isinstance(t, float) for t in times)


def test_swapping_a_layer_with_nothing_swappable_is_keeping_it():
    profile = StepProfile(
        (LayerProfile("a", 100, 0, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        static_bytes=10,
        d2h_bytes_per_second=10.0,
        h2d_bytes_per_second=10.0,
    )
    assert simulate(profile, [True, False], 0, 0) == simulate(profile, [False, False], 0, 0)
    assert simulate(profile, [True, False], 0).swap == (False, False)


def test_no_layers():
    timeline = simulate(StepProfile((), static_bytes=7), [], 0)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.step_seconds) == (7, "static", 0.0)
    assert timeline.peak_cause == "static memory: 7 B"
    assert timeline.memory_curve() == ([0.0], [7])


def test_bad_arguments():
    profile = StepProfile((LayerProfile("a", 1, 1),), static_bytes=0)
    with pytest.raises(ValueError, match="1 layers"):
        simulate(profile, [True, False], 0)
    with pytest.raises(ValueError, match="prefetch_window_bytes"):
        simulate(profile, [True], -1)
    with pytest.raises(ValueError, match="max_copying_out_bytes"):
        simulate(profile, [True], 0, max_copying_out_bytes=-1)
    with pytest.raises(ValueError, match="d2h_bytes_per_second"):
        simulate(StepProfile(profile.layers, 0, d2h_bytes_per_second=0.0), [True], 0)


_swaps = st.lists(st.booleans(), min_size=7, max_size=7)
_limits = st.one_of(st.none(), st.integers(0, 400))


@settings(max_examples=150, deadline=None)
@given(profiles(), st.integers(0, 400), _limits)
def test_nothing_swapped_costs_nothing(profile, window, limit):
    timeline = simulate(profile, [False] * len(profile.layers), window, limit)
    assert timeline.peak_bytes == profile.unconstrained_peak_bytes
    forward = sum(layer.forward_seconds for layer in profile.layers)
    backward = sum(layer.backward_seconds for layer in profile.layers)
    assert timeline.step_seconds == pytest.approx(forward + backward)
    assert timeline.compute_wait_seconds == 0.0


@settings(max_examples=150, deadline=None)
@given(profiles(), _swaps, st.integers(0, 400), st.integers(0, 400), _limits)
def test_window_rules(profile, swap, first, second, limit):
    """Larger windows are never slower and never take less memory; a window behaves in time like
    the largest candidate not above it, with no more memory; streams keep their orders."""
    swap = swap[: len(profile.layers)]
    small, large = sorted((first, second))
    at_small, at_large = simulate(profile, swap, small, limit), simulate(profile, swap, large, limit)
    assert at_large.step_seconds <= at_small.step_seconds
    assert simulate(profile, swap, 0, limit).peak_bytes <= at_small.peak_bytes <= at_large.peak_bytes

    candidates = prefetch_window_candidates(profile, swap)
    at_snapped = simulate(profile, swap, max(c for c in candidates if c <= small), limit)
    assert at_snapped.layers == at_small.layers
    assert (at_snapped.step_seconds, at_snapped.compute_wait_seconds) == (
        at_small.step_seconds,
        at_small.compute_wait_seconds,
    )
    assert at_snapped.peak_bytes <= at_small.peak_bytes

    timeline = at_small
    assert timeline.peak_bytes >= profile.static_bytes
    assert timeline.step_seconds >= timeline.forward_seconds
    clock = 0.0
    for layer in timeline.layers:
        assert layer.forward_start >= clock
        clock = layer.forward_end
    for layer in reversed(timeline.layers):
        assert layer.backward_start >= clock
        clock = layer.backward_end
        if layer.swapped:
            assert layer.copy_out_start >= layer.forward_end
            if layer.retired:
                assert layer.prefetch_start >= timeline.forward_seconds
                assert layer.copy_in_start >= max(layer.copy_out_end, layer.prefetch_start)
                assert layer.backward_start >= layer.copy_in_end
            else:  # used in place: compute waited for its copy out before dropping it
                assert layer.copy_in_start is None and layer.prefetch_start is None
    copies = [layer.copy_in_end or layer.copy_out_end for layer in timeline.layers if layer.swapped]
    assert timeline.step_seconds == pytest.approx(max([clock, *copies]))


@settings(max_examples=150, deadline=None)
@given(profiles(), _swaps, _swaps, st.integers(0, 400), st.integers(0, 400), st.integers(0, 400))
def test_memory_is_monotone_and_least_when_everything_swaps(profile, swap, more, window, first, second):
    """Swapping more, a smaller limit or a smaller window never adds memory; so swapping
    every swappable layer with limit 0 and window 0 has the least peak of all plans."""
    k = len(profile.layers)
    swap = swap[:k]
    more = [a or b for a, b in zip(swap, more[:k], strict=True)]
    simulator = Simulator(profile)
    small, large = sorted((first, second))

    def peak(flags, w, limit):
        return simulator.memory(PlanChoice(tuple(flags), w, limit)).peak_bytes

    assert peak(more, window, small) <= peak(swap, window, small)
    assert peak(swap, window, small) <= peak(swap, window, large) <= peak(swap, window, None)
    least = peak([True] * k, 0, 0)
    assert least <= peak(swap, window, small)

    # Limits between candidates behave like the candidate below in time, with no more memory.
    candidates = limit_candidates(profile, swap)
    snapped = max(c for c in candidates if c <= small)
    at_small, at_snapped = simulate(profile, swap, window, small), simulate(profile, swap, window, snapped)
    assert at_snapped.layers == at_small.layers and at_snapped.step_seconds == at_small.step_seconds
    assert at_snapped.peak_bytes <= at_small.peak_bytes


@settings(max_examples=100, deadline=None)
@given(profiles(min_layers=1), st.integers(0, 400), _limits)
def test_infinite_bandwidth_never_waits(profile, window, limit):
    fast = StepProfile(profile.layers, profile.static_bytes, INF, INF)
    timeline = simulate(fast, [True] * len(fast.layers), window, limit)
    assert timeline.compute_wait_seconds == 0.0
