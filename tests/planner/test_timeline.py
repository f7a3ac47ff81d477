"""The two-stream simulator: hand-computed timelines and properties of its rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner import LayerProfile, StepProfile, prefetch_window_candidates, simulate
from tests.planner.strategies import INF, profiles


def _times(timeline, name):
    layer = next(layer for layer in timeline.layers if layer.name == name)
    return layer


def test_two_swapped_layers_slow_link():
    """a, b: 100 B each, all swappable, F = B = 1 s, 50 B/s both ways (a copy takes 2 s), M = 0.

    Forward:  F_a [0,1], out_a [1,3]; F_b [1,2], out_b starts at max(2, 3) = 3 -> [3,5].
    Peak in forward: at F_b's start (t=1) a is still copying out: 100 + 100 = 200.
    Backward, window 0:
      at the end of forward (2) b is admitted, but it is still copying out: it keeps its
      device copy, no copy in. B_b runs [2,3]. At 3 b is consumed and a admitted (its copy
      out ended at 3, one op earlier): its copy in waits for the stream (out_b) -> [5,7].
      B_a waits 3..7 (4 s), runs [7,8]. Step 8 s, compute waited 4 s.
      At a's admission: 100 (a) = 100; at b's: a (copying out) + b = 200.
    Window 200 (both fit): both admitted at 2 while still copying out: both kept on the
      device, no copies in, no wait: B_b [2,3], B_a [3,4]; the copy out of b still runs until
      5, so the step (makespan) is 5 s. Peak 200 either way.
    """
    profile = StepProfile(
        (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        static_bytes=0,
        d2h_bytes_per_second=50.0,
        h2d_bytes_per_second=50.0,
    )
    timeline = simulate(profile, [True, True], prefetch_window_bytes=0)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.peak_layer, timeline.peak_seconds) == (
        200,
        "forward",
        "b",
        1.0,
    )
    assert timeline.step_seconds == 8.0
    assert timeline.compute_wait_seconds == 4.0
    assert timeline.forward_seconds == 2.0
    a, b = _times(timeline, "a"), _times(timeline, "b")
    assert (a.copy_out_start, a.copy_out_end, b.copy_out_start, b.copy_out_end) == (1.0, 3.0, 3.0, 5.0)
    assert (b.prefetch_start, b.copy_in_start, b.copy_in_end) == (2.0, None, None)
    assert (b.backward_start, b.backward_end) == (2.0, 3.0)
    assert (a.prefetch_start, a.copy_in_start, a.copy_in_end) == (3.0, 5.0, 7.0)
    assert (a.backward_start, a.backward_end) == (7.0, 8.0)

    wide = simulate(profile, [True, True], prefetch_window_bytes=200)
    assert (wide.step_seconds, wide.compute_wait_seconds, wide.peak_bytes) == (5.0, 0.0, 200)
    assert _times(wide, "a").prefetch_start == 2.0 and _times(wide, "a").copy_in_start is None


def test_zero_times_and_infinite_bandwidth_follow_program_order():
    """Zero compute times, infinite bandwidth, M = 1000: only the order of events counts.

    a: saved 100 (60 swappable, 40 resident), b: 50 (all swappable), c: 80 (none swappable).
    Swap a and b. Each compute op lasts one tick, copies none; a copy out that ends at the
    instant a layer starts still counts then (conservative), and is gone one op later.
    Forward:
      start of F_a: 1000 + 100                         = 1100
      start of F_b: 1000 + 40 + 60 (a copying) + 50    = 1150
      start of F_c: 1000 + 40 + 50 (b copying) + 80    = 1170   <- peak (a's copy ended a tick ago)
    Backward, window 0: b admitted at the end of forward: 1000 + 40 (a) + 50 (b) + 80 (c) = 1170;
      a waits until B_b has ended (frees before allocations): 1000 + 100 (a)          = 1100.
    Window 110 (both fit): a admitted with b, before B_c ends: 1000 + 100 + 50 + 80 = 1230,
      as high as swapping nothing.
    Window 109: a is held back, but the engine moves tensors one by one, so up to
      109 - 50 = 59 of a's 60 bytes may already be in: 1000 + 40 + 59 + 50 + 80 = 1229.
    """
    profile = StepProfile(
        (LayerProfile("a", 100, 60), LayerProfile("b", 50, 50), LayerProfile("c", 80, 0)),
        static_bytes=1000,
    )
    narrow = simulate(profile, [True, True, False], prefetch_window_bytes=0)
    assert (narrow.peak_bytes, narrow.peak_event, narrow.peak_layer) == (1170, "forward", "c")
    assert (narrow.step_seconds, narrow.compute_wait_seconds) == (0.0, 0.0)

    wide = simulate(profile, [True, True, False], prefetch_window_bytes=110)
    assert (wide.peak_bytes, wide.peak_event, wide.peak_layer) == (1230, "prefetch", "a")
    partial = simulate(profile, [True, True, False], prefetch_window_bytes=109)
    assert (partial.peak_bytes, partial.peak_event, partial.peak_layer) == (1229, "prefetch", "a")
    assert simulate(profile, [True, True, False], prefetch_window_bytes=50).peak_bytes == 1170  # no room

    assert simulate(profile, [False] * 3, 0).peak_bytes == profile.unconstrained_peak_bytes == 1230


def test_copy_backlog_and_kept_layer():
    """M = 0; a: 100 B swappable, b: 100 B kept (nothing swappable), c: 100 B swappable.
    F = B = 1 s each; 50 B/s out and in (each copy 2 s). Swap a and c, window 100.

    Forward: F_a [0,1] out_a [1,3]; F_b [1,2]; F_c [2,3], out_c starts at max(3, 3) -> [3,5].
      start of F_b: a copying + b         = 200
      start of F_c: a copying + b + c     = 300   <- peak (out_a ends at 3 > 2)
    Backward:
      at 3 c is admitted while still copying out (until 5): it stays, no copy in: b + c = 200.
        a does not fit (100 + 100 > 100). B_c runs [3,4].
      at 4 c is consumed, a admitted: b + a = 200; its copy in waits for the stream (out_c) -> [5,7].
      B_b [4,5]; B_a waits 5..7 (2 s) and runs [7,8].
    Step 8 s, waited 2 s, peak 300 at F_c's start (t = 2).
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
    timeline = simulate(profile, [True, False, True], prefetch_window_bytes=100)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.peak_layer, timeline.peak_seconds) == (
        300,
        "forward",
        "c",
        2.0,
    )
    assert (timeline.step_seconds, timeline.compute_wait_seconds) == (8.0, 2.0)
    a, b, c = (_times(timeline, name) for name in "abc")
    assert (c.copy_out_start, c.copy_out_end, c.prefetch_start, c.copy_in_start) == (3.0, 5.0, 3.0, None)
    assert (c.backward_start, b.backward_start, b.backward_end) == (3.0, 4.0, 5.0)
    assert (a.prefetch_start, a.copy_in_start, a.copy_in_end) == (4.0, 5.0, 7.0)
    assert (a.backward_start, a.backward_end) == (7.0, 8.0)
    assert b.copy_out_start is None and b.prefetch_start is None and not b.swapped


def test_swapping_a_layer_with_nothing_swappable_is_keeping_it():
    profile = StepProfile(
        (LayerProfile("a", 100, 0, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        static_bytes=10,
        d2h_bytes_per_second=10.0,
        h2d_bytes_per_second=10.0,
    )
    assert simulate(profile, [True, False], 0) == simulate(profile, [False, False], 0)
    assert simulate(profile, [True, False], 0).swap == (False, False)


def test_no_layers():
    timeline = simulate(StepProfile((), static_bytes=7), [], 0)
    assert (timeline.peak_bytes, timeline.peak_event, timeline.step_seconds) == (7, "static", 0.0)
    assert timeline.peak_cause == "static memory: 7 B"


def test_bad_arguments():
    profile = StepProfile((LayerProfile("a", 1, 1),), static_bytes=0)
    with pytest.raises(ValueError, match="1 layers"):
        simulate(profile, [True, False], 0)
    with pytest.raises(ValueError, match="prefetch_window_bytes"):
        simulate(profile, [True], -1)
    with pytest.raises(ValueError, match="d2h_bytes_per_second"):
        simulate(StepProfile(profile.layers, 0, d2h_bytes_per_second=0.0), [True], 0)


_swaps = st.lists(st.booleans(), min_size=7, max_size=7)


@settings(max_examples=150, deadline=None)
@given(profiles(), st.integers(0, 400))
def test_nothing_swapped_costs_nothing(profile, window):
    timeline = simulate(profile, [False] * len(profile.layers), window)
    assert timeline.peak_bytes == profile.unconstrained_peak_bytes
    forward = sum(layer.forward_seconds for layer in profile.layers)
    backward = sum(layer.backward_seconds for layer in profile.layers)
    assert timeline.step_seconds == pytest.approx(forward + backward)
    assert timeline.compute_wait_seconds == 0.0


@settings(max_examples=150, deadline=None)
@given(profiles(), _swaps, st.integers(0, 400), st.integers(0, 400))
def test_window_rules(profile, swap, first, second):
    """Larger windows are never slower; window 0 has the least peak; a window behaves like the
    largest candidate not above it; compute order and copy order are respected."""
    swap = swap[: len(profile.layers)]
    small, large = sorted((first, second))
    at_small, at_large = simulate(profile, swap, small), simulate(profile, swap, large)
    assert at_large.step_seconds <= at_small.step_seconds
    assert simulate(profile, swap, 0).peak_bytes <= min(at_small.peak_bytes, at_large.peak_bytes)

    # A window behaves like the largest candidate not above it, but for the part of a held
    # back layer that may already be in (it grows with the room left in the window).
    candidates = prefetch_window_candidates(profile, swap)
    at_snapped = simulate(profile, swap, max(c for c in candidates if c <= small))
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
        assert layer.forward_start == pytest.approx(clock)
        clock = layer.forward_end
    for layer in reversed(timeline.layers):
        assert layer.backward_start >= clock
        clock = layer.backward_end
        if layer.swapped:
            assert layer.copy_out_start >= layer.forward_end
            assert layer.prefetch_start >= timeline.forward_seconds
            if layer.copy_in_start is None:  # kept its device copy: still copying out when admitted
                assert layer.copy_out_end >= layer.prefetch_start
            else:
                assert layer.copy_in_start >= max(layer.copy_out_end, layer.prefetch_start)
                assert layer.backward_start >= layer.copy_in_end
    copies = [layer.copy_in_end or layer.copy_out_end for layer in timeline.layers if layer.swapped]
    assert timeline.step_seconds == pytest.approx(max([clock, *copies]))


@settings(max_examples=100, deadline=None)
@given(profiles(min_layers=1), st.integers(0, 400))
def test_infinite_bandwidth_never_waits(profile, window):
    fast = StepProfile(profile.layers, profile.static_bytes, INF, INF)
    timeline = simulate(fast, [True] * len(fast.layers), window)
    assert timeline.compute_wait_seconds == 0.0
