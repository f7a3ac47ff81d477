"""Working memory (what the ledger never sees) in the planner: each term where the timeline puts
it, the same in every path that computes a peak or checks a cap, and in the refusal's figure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner.blocks import checkpoint_blocks_plan
from lightning_accudnn.planner.bounds import lower_bound_seconds
from lightning_accudnn.planner.frontier import fitting_set
from lightning_accudnn.planner.plan import (
    BudgetTooSmallError,
    HostLimitTooSmallError,
    min_budget_bytes,
    plan_swaps,
    swap_everything_peak_bytes,
)
from lightning_accudnn.planner.recompute import (
    SegmentSpan,
    candidate_spans,
    named_spans,
    recomputed_profile,
    swapped_pass_forward_bound,
)
from lightning_accudnn.planner.scaling import scale_profile
from lightning_accudnn.planner.search import fitting_sets
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
from tests.planner.strategies import brute_force
from tests.planner.test_search_properties import staged_profiles


def _three(static: int = 10, **working: tuple[int, int]) -> StepProfile:
    """a, b, c: 100 B each, all swappable; ``working[name] = (forward, backward)``."""
    layers = tuple(
        LayerProfile(
            name,
            100,
            100,
            1.0,
            1.0,
            forward_working_bytes=working.get(name, (0, 0))[0],
            backward_working_bytes=working.get(name, (0, 0))[1],
        )
        for name in "abc"
    )
    return StepProfile(layers, static_bytes=static)


def test_the_fields_default_to_zero_and_refuse_negative_bytes_between_passes():
    """A layer's may be negative (model state not allocated yet at its levels); not between passes."""
    layer = LayerProfile("a", 1, 1)
    assert (layer.forward_working_bytes, layer.backward_working_bytes) == (0, 0)
    assert StepProfile((layer,), 0).outside_working_bytes == 0
    assert "working" not in repr(layer)
    assert (
        LayerProfile("a", 1, 1, forward_working_bytes=-1, backward_working_bytes=-2).backward_working_bytes
        == -2
    )
    with pytest.raises(ValueError, match="outside_working_bytes"):
        StepProfile((layer,), 0, outside_working_bytes=-1)


def test_forward_working_memory_raises_its_forward_level_and_the_peak():
    """Nothing swapped, M = 10: forward levels 110, 210, 310, backward the same. 250 B of working
    memory in F_a: F_a holds 360, the peak, and nothing else changes."""
    plain = Simulator(_three()).memory(PlanChoice((False,) * 3))
    assert plain.forward_levels == (110, 210, 310) and plain.peak_bytes == 310
    simulator = Simulator(_three(a=(250, 0)))
    choice = PlanChoice((False,) * 3)
    memory = simulator.memory(choice)
    assert memory.forward_levels == (360, 210, 310)
    assert memory.backward_levels == plain.backward_levels
    assert (memory.peak_bytes, memory.peak_event, memory.peak_index) == (360, "forward", 0)
    assert simulator.peak_bytes(choice) == 360
    assert simulator.largest_window(choice.swap, 0, 359) is None
    # Swapping everything (limit 0): F_b holds M + a in flight + b = 210, with 250 more in F_b 460.
    swapped = Simulator(_three(b=(250, 0))).memory(PlanChoice((True,) * 3, 0, 0))
    assert swapped.forward_levels == (110, 460, 210) and swapped.peak_bytes == 460


def test_backward_working_memory_raises_its_backward_level_and_the_peak():
    """150 B in B_b: B_b holds M + a + b + 150 = 360 (nothing swapped)."""
    simulator = Simulator(_three(b=(0, 150)))
    choice = PlanChoice((False,) * 3)
    memory = simulator.memory(choice)
    assert memory.backward_levels == (110, 360, 310)
    assert memory.forward_levels == (110, 210, 310)
    assert (memory.peak_bytes, memory.peak_event, memory.peak_index) == (360, "backward", 1)
    assert simulator.peak_bytes(choice) == 360
    # Everything swapped, limit and window 0 (a and b retired): B_b holds M + b's bytes back =
    # 110, plus 150; the other levels are at most 210.
    swapped = Simulator(_three(b=(0, 150)))
    everything = PlanChoice((True,) * 3, 0, 0)
    assert swapped.memory(everything).backward_levels == (110, 260, 210)
    assert swapped.peak_bytes(everything) == 260
    assert swapped.largest_window(everything.swap, 0, 259) is None


def test_outside_working_memory_is_a_floor_of_the_peak():
    profile = replace(_three(), outside_working_bytes=1_000)
    simulator = Simulator(profile)
    choice = PlanChoice((True,) * 3, 0, 0)
    memory = simulator.memory(choice)
    assert (memory.peak_bytes, memory.peak_event, memory.peak_index) == (1_010, "between passes", -1)
    assert simulator.peak_bytes(choice) == 1_010
    assert simulator.largest_window(choice.swap, 0, 1_009) is None
    assert simulator.timeline(choice).peak_cause.startswith("between the passes")
    assert fitting_sets(profile, [], 1_009) == []


def _segment_profile(x: tuple[int, int], y: tuple[int, int], head: tuple[int, int] = (0, 0)) -> StepProfile:
    """stem, blk.x, blk.y, head (M = 0); blk (inputs 40 B, outputs 30 B) may be recomputed."""
    layers = (
        LayerProfile("stem", 40, 40, 1.0, 1.0),
        LayerProfile("blk.x", 100, 100, 1.0, 1.0, forward_working_bytes=x[0], backward_working_bytes=x[1]),
        LayerProfile("blk.y", 100, 100, 1.0, 1.0, forward_working_bytes=y[0], backward_working_bytes=y[1]),
        LayerProfile(
            "head", 200, 200, 1.0, 1.0, forward_working_bytes=head[0], backward_working_bytes=head[1]
        ),
    )
    return StepProfile(layers, 0, segments=(SegmentProfile("blk", 40, output_bytes=30),))


@pytest.mark.parametrize(
    ("x", "y", "extra"),
    # (rebuilding forward) blk.x's 70 are held beside blk.x's 100 B rebuilt, not all 200: blk.x
    # again 170, blk.y 220 and then the gradient blk's backward starts from (at most blk.y's 40),
    # 260 = 200 + 60. (backward) that way 310 = 200 + 110: more than blk.y's 90 beside all 200.
    [((70, 10), (20, 40), 60), ((5, 10), (20, 90), 90), ((0, 0), (0, 0), 0)],
    ids=["rebuilding forward", "backward", "none"],
)
def test_a_recomputed_layer_holds_the_working_memory_of_its_layers_beside_its_saves_rebuilt(x, y, extra):
    """blk recomputed: its layer holds its 40 B of inputs; head counts blk's 30 B of outputs once
    more (230 B). B_blk holds stem + blk = 80, plus blk's 200 B of saves rebuilt (its transient),
    plus the most any of blk's layers holds while its forward runs again or its backward runs,
    or less, where the order the saves are rebuilt in and read in leaves no more room.
    F_blk holds 80 plus, at most, blk's layers' outputs up to each (their saves: 100, 200) and
    that layer's own working memory; head's levels 310 plus its own. Nothing
    recomputed peaks at 449 (B_head): the plan recomputes blk."""
    profile = _segment_profile(x, y, head=(7, 9))
    step = recomputed_profile(profile, candidate_spans(profile))
    assert [layer.name for layer in step.profile.layers] == ["stem", "blk", "head"]
    assert step.transient_bytes == (0, 200, 0)
    head = step.profile.layers[2]
    assert (head.saved_bytes, head.forward_working_bytes, head.backward_working_bytes) == (230, 7, 9)
    memory = Simulator(step.profile, step.transient_bytes).memory(PlanChoice((False,) * 3))
    assert memory.backward_levels[1] == 80 + 200 + extra
    assert memory.forward_levels[1] == 80 + max(100 + x[0], 200 + y[0])
    assert memory.forward_levels[2] == 310 + 7 and memory.backward_levels[2] == 310 + 9
    peak = max(319, 280 + extra)
    assert memory.peak_bytes == peak
    plan = plan_swaps(profile, peak, policy="recompute")
    assert plan.recomputed == ("blk",) and plan.predicted_peak_bytes == peak
    assert plan.peak_bytes_on(profile) == peak
    assert plan.predicted_ledger_peak_bytes == 310  # neither the transient nor working memory


def test_the_ledger_peak_leaves_working_memory_out():
    profile = _three(b=(0, 150))
    plan = plan_swaps(profile, 400)
    assert plan.predicted_peak_bytes == 360 and plan.predicted_ledger_peak_bytes == 310


def _with_working(profile: StepProfile, draw) -> StepProfile:
    # negative too: model state not allocated yet at a level (the gradients before their backward)
    extras = st.one_of(st.just(0), st.integers(0, 120), st.integers(-60, 0))
    alive = st.one_of(st.just(0), st.integers(0, 150))
    layers = tuple(
        replace(
            layer,
            forward_working_bytes=draw(extras),
            backward_working_bytes=draw(extras),
            retired_alive_bytes=draw(alive),
        )
        for layer in profile.layers
    )
    # sometimes above every level: the floor sets the peak
    between = st.one_of(st.just(0), st.integers(0, 120), st.integers(0, 4_000))
    return replace(profile, layers=layers, outside_working_bytes=draw(between))


@st.composite
def _cases(draw):
    """A profile of up to 8 layers, with re-saves or not, working memory, transients, and a plan."""
    count = draw(st.integers(1, 8))
    layers = []
    for i in range(count):
        saved = draw(st.integers(0, 100))
        swappable = draw(st.one_of(st.just(saved), st.integers(0, saved)))
        resaved = []
        left = swappable
        for _ in range(draw(st.integers(0, 2))):
            if i + 1 < count and left > 0:
                nbytes = draw(st.integers(1, left))
                resaved.append((f"l{draw(st.integers(i + 1, count - 1))}", nbytes))
                left -= nbytes
        layers.append(LayerProfile(f"l{i}", saved, swappable, 1.0, 1.0, resaved_by=tuple(resaved)))
    profile = _with_working(StepProfile(tuple(layers), draw(st.integers(0, 50))), draw)
    transient = tuple(draw(st.one_of(st.just(0), st.integers(0, 80))) for _ in range(count))
    swap = tuple(draw(st.booleans()) for _ in range(count))
    limit = draw(st.one_of(st.none(), st.integers(0, 300)))
    return profile, transient, swap, limit


@settings(max_examples=300, deadline=None)
@given(_cases(), st.integers(0, 400), st.integers(0, 800))
def test_every_path_counts_working_memory_alike(case, window, cap):
    """``peak_bytes`` is ``memory().peak_bytes``; ``largest_window`` gives the largest window whose
    peak is within the cap; and every level is the level without working memory plus its term."""
    profile, transient, swap, limit = case
    simulator = Simulator(profile, transient)
    choice = PlanChoice(swap, window, limit)
    memory = simulator.memory(choice)
    assert simulator.peak_bytes(choice) == memory.peak_bytes
    plain = Simulator(profile.without_working_bytes(), transient).memory(choice)
    backward = tuple(
        level + layer.backward_working_bytes
        for level, layer in zip(plain.backward_levels, profile.layers, strict=True)
    )
    assert memory.backward_levels == backward
    # Forward: plus its working memory, and at most as much of what swapped storages the model's
    # code still holds as was swapped before it (none before the first swap).
    pushed = 0
    for level, layer, swapped, moving, measured in zip(
        plain.forward_levels,
        profile.layers,
        simulator.effective(swap),
        simulator.swappable,
        memory.forward_levels,
        strict=True,
    ):
        assert level + layer.forward_working_bytes <= measured
        assert measured <= level + layer.forward_working_bytes + min(layer.retired_alive_bytes, pushed)
        pushed += moving if swapped else 0
    floor = profile.static_bytes + profile.outside_working_bytes
    assert memory.peak_bytes == max(floor, *memory.forward_levels, *backward)
    largest = simulator.largest_window(swap, limit, cap)
    if largest is None:
        assert simulator.memory(PlanChoice(swap, 0, limit)).peak_bytes > cap
    else:
        assert simulator.memory(PlanChoice(swap, largest, limit)).peak_bytes <= cap
        comes_back = sum(simulator.swappable) + 1
        if largest < comes_back:
            more = simulator.memory(PlanChoice(swap, largest + 1, limit)).peak_bytes
            assert more > cap or more == simulator.memory(PlanChoice(swap, comes_back, limit)).peak_bytes


@st.composite
def _small_profiles(draw):
    count = draw(st.integers(1, 4))
    seconds = st.sampled_from([0.0, 0.5, 1.0, 2.0])
    layers = []
    for i in range(count):
        saved = draw(st.integers(0, 100))
        swappable = draw(st.one_of(st.just(saved), st.integers(0, saved)))
        layers.append(LayerProfile(f"l{i}", saved, swappable, draw(seconds), draw(seconds)))
    link = draw(st.sampled_from([float("inf"), 50.0, 100.0]))
    return _with_working(StepProfile(tuple(layers), draw(st.integers(0, 50)), link, link), draw)


def test_the_largest_window_that_fits_reaches_the_layers_the_fifo_left():
    """Two 1-byte layers swapped at copy-out limit 0: the second stays in the FIFO (nothing comes
    back for it) and memory is the same at every window from 1 byte on, but the window admits the
    first's copy beside the second's bytes only from 2 bytes on, which starts it at the
    backward's start (0.54 s against 0.56 s): the search finds that window."""
    layers = (
        LayerProfile("l0", 1, 1, 0.0, 0.0),
        LayerProfile("l1", 1, 1, 0.0, 0.0),
        LayerProfile("l2", 0, 0, 0.0, 0.5, forward_working_bytes=1),
    )
    profile = StepProfile(layers, 0, d2h_bytes_per_second=50.0, h2d_bytes_per_second=50.0)
    simulator = Simulator(profile)
    swap = (True, True, False)
    assert [simulator.peak_bytes(PlanChoice(swap, window, 0)) for window in (0, 1, 2, 3)] == [2, 2, 2, 2]
    assert [simulator.times(PlanChoice(swap, window, 0)).step_seconds for window in (1, 2)] == [0.56, 0.54]
    assert simulator.largest_window(swap, 0, 2) == 2
    plan = plan_swaps(profile, 2, policy="swap")
    assert (plan.predicted_step_seconds, plan.prefetch_window_bytes) == (0.54, 2)


@settings(max_examples=60, deadline=None)
@given(_small_profiles(), st.floats(0.0, 1.2))
def test_the_swap_search_is_exact_with_working_memory(profile, fraction):
    """Against a brute force over every swap set, limit and window (the exact simulator): the
    plan is as fast as the fastest that fits, and the smallest budget is the least peak."""
    best, least = brute_force(profile, 0)
    cap = least + int(
        fraction * (Simulator(profile).peak_bytes(PlanChoice((False,) * len(profile.layers))) - least)
    )
    best, _ = brute_force(profile, cap)
    assert min_budget_bytes(profile, policy="swap") == least
    plan = plan_swaps(profile, cap, policy="swap")
    assert plan.predicted_step_seconds == best
    assert plan.predicted_peak_bytes <= cap


def _rebuilt_peak(plan, profile: StepProfile) -> int:
    """The plan's peak rebuilt from the levels without working memory plus each term."""
    spans = named_spans(profile, plan.policy, plan.recomputed, plan.selective)
    step = recomputed_profile(profile, spans, swappable=plan.policy != "recompute")
    position = {layer.name: i for i, layer in enumerate(profile.layers)}
    swap = tuple(
        len(origin) == 1 and plan.swap[position[layer.name]]
        for layer, origin in zip(step.profile.layers, step.origin, strict=True)
    )
    choice = PlanChoice(swap, plan.prefetch_window_bytes, plan.max_copying_out_bytes)
    # without working memory, but with what swapped storages the model's code still holds
    # (a term of the forward levels that depends on the plan's swaps)
    layers = tuple(
        replace(layer, forward_working_bytes=0, backward_working_bytes=0) for layer in step.profile.layers
    )
    plain_profile = replace(step.profile, layers=layers, outside_working_bytes=0)
    plain = Simulator(plain_profile, step.transient_bytes).memory(choice)
    levels = [profile.static_bytes + profile.outside_working_bytes]
    for level, layer in zip(plain.forward_levels, step.profile.layers, strict=True):
        levels.append(level + layer.forward_working_bytes)
    for level, layer, indices in zip(plain.backward_levels, step.profile.layers, step.origin, strict=True):
        inner = [profile.layers[i] for i in indices]
        if len(indices) > 1 or layer.name not in position:  # recomputed: its forward runs again
            working = max(max(one.forward_working_bytes, one.backward_working_bytes) for one in inner)
            span = next(span for span in spans if span.name == layer.name)
            if span.rebuilt_bytes is None and not span.inner:  # whole: each save alive until read
                rebuilt, rerun, backward = 0, 0, []
                for one in inner:
                    rebuilt += one.saved_bytes
                    rerun = max(rerun, rebuilt + max(0, one.forward_working_bytes))
                    backward.append(rebuilt + one.backward_working_bytes)
                ordered = max(*backward, rerun + max(0, inner[-1].backward_working_bytes)) - rebuilt
                working = min(working, ordered)
        else:
            working = inner[0].backward_working_bytes
        levels.append(level + working)
    return max(levels)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["auto", "swap", "recompute"]), st.floats(0.0, 1.0))
def test_the_search_never_returns_a_plan_above_the_cap(data, policy, fraction):
    profile = _with_working(data.draw(staged_profiles()), data.draw)
    smallest = min_budget_bytes(profile, policy=policy)
    top = Simulator(profile).peak_bytes(PlanChoice((False,) * len(profile.layers)))
    budget = smallest + int(fraction * max(0, top - smallest))
    plan = plan_swaps(profile, budget, policy=policy)
    assert plan.predicted_peak_bytes <= budget
    assert _rebuilt_peak(plan, profile) == plan.predicted_peak_bytes
    with pytest.raises(BudgetTooSmallError):
        plan_swaps(profile, smallest - 1, policy=policy)


def test_the_refusal_names_a_budget_with_working_memory():
    """Everything swapped at limit 0: F_b holds M + a in flight + b = 210, plus 500 in F_b."""
    profile = _three(b=(500, 0))
    assert swap_everything_peak_bytes(profile) == 710
    with pytest.raises(BudgetTooSmallError, match="needs 710B") as caught:
        plan_swaps(profile, 600)
    assert caught.value.min_budget_bytes == 710
    outside = replace(profile, outside_working_bytes=2_000)
    with pytest.raises(BudgetTooSmallError) as caught:
        plan_swaps(outside, 1_000)
    assert caught.value.min_budget_bytes == 2_010
    assert plan_swaps(outside, 2_010).predicted_peak_bytes == 2_010


def test_the_host_limit_refusal_names_the_nothing_swapped_budget_with_working_memory():
    with pytest.raises(HostLimitTooSmallError) as caught:
        plan_swaps(_three(c=(0, 40)), budget_bytes=300, host_limit_bytes=50)
    assert caught.value.nothing_swapped_budget_bytes == 350


def test_the_fitting_program_counts_kept_layers_working_memory():
    """a, b recomputed (1 s, 2 s), each 200 B of saves and 10 B of inputs; a kept layer after
    them saves 10 B and holds 150 B while it runs. Recomputing a alone ends the forward with
    220 B, but the last layer then holds 370 > 330: both must be recomputed (30 + 150 = 180;
    b's backward 20 + 200 = 220)."""
    spans = [SegmentSpan("a", 0, 1, 10, 200, 1.0), SegmentSpan("b", 2, 3, 10, 200, 2.0)]
    saved = [100, 100, 100, 100, 10]
    assert [span.name for span in fitting_set(spans, saved, 330)] == ["a"]
    working = [0, 0, 0, 0, 150]
    assert [span.name for span in fitting_set(spans, saved, 330, working_bytes=working)] == ["a", "b"]
    assert fitting_set(spans, saved, 179, working_bytes=working) is None


def test_the_fitting_program_counts_a_recomputed_span_s_working_memory_on_its_transient():
    """Recomputing a (1 s) or b (2 s) fits 340 B (a's backward 10 + 200, the forward's end 230;
    b's backward 200 + 10 + 120), but 150 B of working memory in a's first layer, on top of a's
    200 B rebuilt, do not: b alone does (a's first layer, kept, 100 + 150)."""
    spans = [SegmentSpan("a", 0, 1, 10, 200, 1.0), SegmentSpan("b", 2, 3, 10, 120, 2.0)]
    saved = [100, 100, 60, 60, 100]
    assert [span.name for span in fitting_set(spans, saved, 340)] == ["a"]
    working = [150, 0, 0, 0, 0]
    assert [span.name for span in fitting_set(spans, saved, 340, working_bytes=working)] == ["b"]


def test_the_lower_bound_counts_the_last_layer_s_working_memory():
    """X = 100 + 400 + 100 - 200 = 400 B off the device: max(1, 4) + max(2, 8) (9 s without)."""
    layer = LayerProfile("a", 400, 400, 1.0, 2.0, forward_working_bytes=100, backward_working_bytes=60)
    profile = StepProfile((layer,), static_bytes=100, d2h_bytes_per_second=100.0, h2d_bytes_per_second=50.0)
    assert lower_bound_seconds(profile, budget_bytes=200) == 12.0
    assert lower_bound_seconds(profile.without_working_bytes(), budget_bytes=200) == 9.0


def test_scaling_scales_working_memory_like_the_layer_s_bytes():
    layer = LayerProfile("a", 100, 100, 1.0, 1.0, forward_working_bytes=30, backward_working_bytes=50)
    profile = StepProfile((layer,), 1_000, outside_working_bytes=70)
    doubled = scale_profile(profile, 2.0)
    scaled = doubled.layers[0]
    assert (scaled.forward_working_bytes, scaled.backward_working_bytes) == (60, 100)
    assert doubled.outside_working_bytes == 140  # the batch held between the passes grows
    assert scale_profile(profile, 0.5).outside_working_bytes == 70  # the optimizer's does not shrink
    measured = scale_profile(profile, 2.0, measured=[LayerProfile("a", 300, 300)])
    assert (measured.layers[0].forward_working_bytes, measured.layers[0].backward_working_bytes) == (90, 150)
    own = LayerProfile("a", 300, 300, forward_working_bytes=5, backward_working_bytes=6)
    remeasured = scale_profile(profile, 2.0, measured=[own]).layers[0]
    assert (remeasured.forward_working_bytes, remeasured.backward_working_bytes) == (5, 6)


def test_checkpointing_every_block_counts_working_memory():
    """h.0 and h.1 recomputed (10 B of inputs each): B_h.1 holds 20 + its 100 B rebuilt + the 50 B
    its forward holds when it runs again (more than its backward's 30)."""
    layers = (
        LayerProfile("h.0.fc", 100, 100, 1e-3, 2e-3, backward_working_bytes=5),
        LayerProfile("h.1.fc", 100, 100, 1e-3, 2e-3, forward_working_bytes=50, backward_working_bytes=30),
    )
    profile = StepProfile(layers, 0, segments=(SegmentProfile("h.0", 10), SegmentProfile("h.1", 10)))
    plan = checkpoint_blocks_plan(profile, budget_bytes=1_000)
    assert plan.recomputed == ("h.0", "h.1") and plan.predicted_peak_bytes == 170
    assert (
        checkpoint_blocks_plan(profile.without_working_bytes(), budget_bytes=1_000).predicted_peak_bytes
        == 120
    )


def test_a_swapped_storage_the_model_still_holds_is_in_the_forward_levels_after_it():
    """M = 0, L = 0: a's 100 B are retired once b's copy is out (before F_c); 60 B of them were
    still held by the model's code at F_c, measured with everything swapped."""
    layers = (
        LayerProfile("a", 100, 100),
        LayerProfile("b", 100, 100),
        LayerProfile("c", 100, 100, retired_alive_bytes=60),
    )
    simulator = Simulator(StepProfile(layers, 0))
    swapped = simulator.memory(PlanChoice((True, True, False), 0, 0))
    assert swapped.forward_levels == (100, 200, 100 + 100 + 60)  # b in the FIFO, 60 of a alive
    only_b = simulator.memory(PlanChoice((False, True, False), 0, 0))
    assert only_b.forward_levels == (100, 200, 300)  # b still in the FIFO: nothing retired
    kept = simulator.memory(PlanChoice((False, False, False), 0, 0))
    assert kept.forward_levels == (100, 200, 300)


def test_memory_between_the_passes_alone_charges_a_recomputed_segment_no_outputs_in_forward():
    """A traced profile lists no working memory at its layers (the ledger's bytes at each level)
    but may list the optimizer step's between the passes: its recomputed segments are not then
    charged their layers' outputs in forward (up to all they save, which made a recomputed stage
    of ResNet-152 cost as much in forward as keeping it)."""
    profile = replace(_segment_profile((0, 0), (0, 0)), outside_working_bytes=50)
    (span,) = named_spans(profile, "recompute", ("blk",), ())
    step = recomputed_profile(profile, [span])
    segment = next(layer for layer in step.profile.layers if layer.name == "blk")
    assert (segment.forward_working_bytes, segment.backward_working_bytes) == (0, 0)
    assert step.profile.outside_working_bytes == 50


@pytest.mark.parametrize(
    ("held", "expected"),
    [
        ({"stem": 0, "blk.x": 15, "blk.y": -20}, 100 + 100 - 20),  # at blk.y: x and y in flight
        ({"stem": 0, "blk.x": 15, "blk.y": 120}, 200 + 20),  # above the saves bound: that one stands
        ({"stem": 0, "blk.x": 15}, 200 + 20),  # blk.y not measured: the saves bound
        ({"stem": 170, "blk.x": 15, "blk.y": -20}, 40 + 170),  # at stem, before blk's first save
    ],
    ids=["swapped pass", "saves", "unlisted layer", "before"],
)
def test_a_recomputed_segment_s_forward_holds_no_more_than_the_swapped_pass_did(held, expected):
    """blk's forward saves nothing: at each of its layers it holds no more than a pass that swapped
    everything held there beyond its ledger (``held``), beside that ledger's copies in flight (the
    layer before with bytes to copy and its own) and its kept saves, nor more than its layers' saves
    up to each plus their working memory (x: 100 + 5, y: 200 + 20)."""
    profile = replace(_segment_profile((5, 0), (20, 0)), swapped_pass_forward_bytes=tuple(held.items()))
    (span,) = named_spans(profile, "recompute", ("blk",), ())
    step = recomputed_profile(profile, [span])
    segment = next(layer for layer in step.profile.layers if layer.name == "blk")
    assert segment.forward_working_bytes == expected
    assert step.profile.swapped_pass_forward_bytes == ()  # the recomputed step's own: none measured


def test_the_swapped_pass_bound_counts_a_layer_s_kept_saves_and_the_copies_in_flight():
    """A kept small storage of x's (10 B) stays on that pass's ledger; y, which swaps nothing, has
    x's 90 B in flight still. The layer before the segment is counted (what runs before the
    segment's first save is charged to it), its kept bytes not (the segment's level holds them)."""
    layers = [LayerProfile("x", 100, 90), LayerProfile("y", 50, 0), LayerProfile("z", 30, 30)]
    held = {"w": 200, "x": 0, "y": 0, "z": 0}
    assert swapped_pass_forward_bound(None, layers, 7, held) == max(10 + 7 + 90, 60 + 90, 60 + 90 + 30)
    assert swapped_pass_forward_bound(None, [], 7, held) == 0
    before = LayerProfile("w", 80, 50)
    assert swapped_pass_forward_bound(before, layers, 7, held) == 7 + 50 + 200


def test_the_swapped_pass_follows_working_memory_added_and_is_dropped_with_it_and_by_scaling():
    profile = replace(_segment_profile((5, 0), (20, 0)), swapped_pass_forward_bytes=(("blk.x", 15),))
    assert profile.with_working_bytes_added(10).swapped_pass_forward_bytes == (("blk.x", 25),)
    assert profile.rebased(30).swapped_pass_forward_bytes == (("blk.x", -15),)
    assert profile.without_working_bytes().swapped_pass_forward_bytes == ()
    assert scale_profile(profile, 2.0).swapped_pass_forward_bytes == ()
