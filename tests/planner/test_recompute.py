"""The planner's third choice: recompute segments, charged to backward, their saves held while it runs."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner.plan import (
    BudgetTooSmallError,
    min_budget_bytes,
    plan_swaps,
    swap_everything_peak_bytes,
)
from lightning_accudnn.planner.recompute import SegmentSpan, candidate_spans, recomputed_profile
from lightning_accudnn.planner.search import nested_spans, recompute_sets
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerChoice, LayerProfile, SegmentProfile, StepProfile
from tests.planner.strategies import run_sums

GB = 10**9


def _blocks(count: int, link: float, *, saved: int = GB, forward: float = 1e-3) -> StepProfile:
    """``count`` residual-like blocks of two layers each, inputs a quarter of what they save."""
    layers = []
    for block in range(count):
        layers.append(LayerProfile(f"b{block}.conv", saved // 2, saved // 2, forward / 2, forward))
        layers.append(LayerProfile(f"b{block}.relu", saved // 2, saved // 2, forward / 2, forward))
    segments = tuple(SegmentProfile(f"b{block}", saved // 4) for block in range(count))
    return StepProfile(
        tuple(layers),
        static_bytes=GB,
        d2h_bytes_per_second=link,
        h2d_bytes_per_second=link,
        segments=segments,
    )


def test_slow_link_fast_compute_the_hybrid_beats_swapping_alone():
    profile = _blocks(6, link=2 * GB)
    budget = profile.static_bytes + profile.saved_bytes // 3
    swap = plan_swaps(profile, budget, policy="swap")
    auto = plan_swaps(profile, budget, policy="auto")
    assert auto.recomputed  # recomputing 1 ms of forward beats copying 1 GB at 2 GB/s
    assert auto.predicted_step_seconds < swap.predicted_step_seconds
    assert auto.predicted_peak_bytes <= budget
    assert LayerChoice.RECOMPUTE in auto.choices
    assert "recompute" in str(auto) and auto.to_dict()["recomputed_segments"] == list(auto.recomputed)
    assert auto.recompute_seconds > 0
    # the swap-only bound does not hold for a plan that recomputes; the policy's bound does
    assert auto.lower_bound_seconds <= auto.predicted_step_seconds < swap.lower_bound_seconds


def test_fast_link_chooses_swaps():
    profile = _blocks(6, link=1e15)
    budget = profile.static_bytes + profile.saved_bytes // 3
    auto = plan_swaps(profile, budget, policy="auto")
    swap = plan_swaps(profile, budget, policy="swap")
    assert auto.recomputed == ()
    assert auto.swap == swap.swap and auto.predicted_step_seconds == swap.predicted_step_seconds


def test_recompute_policy_never_swaps_and_swap_policy_never_recomputes():
    profile = _blocks(4, link=2 * GB)
    budget = profile.static_bytes + profile.saved_bytes // 2
    recompute = plan_swaps(profile, budget, policy="recompute")
    assert not any(recompute.swap) and recompute.recomputed
    assert set(recompute.choices) <= {LayerChoice.KEEP, LayerChoice.RECOMPUTE}
    assert not plan_swaps(profile, budget, policy="swap").recomputed


def test_an_unknown_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match="'auto', 'swap', 'recompute'"):
        plan_swaps(_blocks(1, 1e9), 10 * GB, policy="fastest")


def _unswappable_blocks() -> StepProfile:
    layers = (
        LayerProfile("b0.a", 50, 0, 1.0, 1.0),
        LayerProfile("b0.b", 50, 0, 1.0, 1.0),
        LayerProfile("b1.a", 50, 0, 1.0, 1.0),
        LayerProfile("b1.b", 50, 0, 1.0, 1.0),
        LayerProfile("head", 10, 10, 1.0, 1.0),
    )
    segments = (SegmentProfile("b0", 10), SegmentProfile("b1", 10))
    return StepProfile(layers, static_bytes=0, segments=segments)


def test_no_budget_below_the_profiling_pass_even_where_only_recomputation_would_fit():
    """Both blocks recomputed would peak at 10 + 10 held and one block's 100 saved again while
    its backward runs (120), but the profiling pass swaps what it can and recomputes nothing:
    210. The smallest budget of every policy is that pass's peak, and it plans."""
    profile = _unswappable_blocks()
    assert swap_everything_peak_bytes(profile) == 210
    for policy in ("swap", "auto", "recompute"):
        assert min_budget_bytes(profile, policy=policy) == 210
        assert min_budget_bytes(profile, reserve_bytes=7, policy=policy) == 217
        with pytest.raises(BudgetTooSmallError) as caught:
            plan_swaps(profile, 209, policy=policy)
        assert caught.value.min_budget_bytes == 210
        assert caught.value.profiling_binds is (policy != "swap")
        plan = plan_swaps(profile, 210, policy=policy)
        assert plan.predicted_peak_bytes <= 210
        assert plan.min_budget_bytes == plan.profiling_peak_bytes == 210
    with pytest.raises(BudgetTooSmallError, match="first pass of a new batch shape .* swaps every"):
        plan_swaps(profile, 150, policy="auto")
    with pytest.raises(BudgetTooSmallError, match="even the least memory-hungry plan needs"):
        plan_swaps(profile, 150, policy="swap")


def test_a_measured_profiling_peak_replaces_the_computed_one():
    """The session passes its profiling pass's ledger peak: above the computed one when the
    host-memory limit kept storages on the device (the error then says what host memory for
    everything would need, where the limit cannot take every activation), below it when the
    storages split better than the worst case."""
    profile = _unswappable_blocks()  # computed: 210; least peak recomputing: 120
    assert min_budget_bytes(profile, policy="swap", profiling_peak_bytes=250) == 250
    assert min_budget_bytes(profile, policy="auto", profiling_peak_bytes=150) == 150
    assert min_budget_bytes(profile, policy="auto", profiling_peak_bytes=100) == 120
    assert min_budget_bytes(profile, policy="swap", profiling_peak_bytes=100) == 210
    swappable = sum(layer.swappable_bytes for layer in profile.layers)
    with pytest.raises(BudgetTooSmallError, match="raise host_memory_limit") as caught:
        plan_swaps(
            profile,
            249,
            reserve_bytes=4,
            policy="swap",
            profiling_peak_bytes=250,
            host_limit_bytes=swappable - 1,
        )
    assert caught.value.min_budget_bytes == 254 and caught.value.profiling_binds
    assert caught.value.with_host_memory_for_all_bytes == 214
    # A host limit that takes every activation (or none given) kept nothing on the device: the
    # measured peak is the step's own, and the error does not send the user to the host limit.
    for limit in (swappable, None):
        with pytest.raises(BudgetTooSmallError) as caught:
            plan_swaps(
                profile, 249, reserve_bytes=4, policy="swap", profiling_peak_bytes=250, host_limit_bytes=limit
            )
        assert caught.value.min_budget_bytes == 254
        assert caught.value.with_host_memory_for_all_bytes is None
        assert "host_memory_limit" not in str(caught.value)
    plan = plan_swaps(profile, 254, reserve_bytes=4, policy="recompute", profiling_peak_bytes=250)
    assert plan.min_budget_bytes == 254 and plan.profiling_peak_bytes == 250
    assert plan.to_dict()["profiling_peak_bytes"] == 250
    with pytest.raises(BudgetTooSmallError) as caught:
        plan_swaps(profile, 149, policy="auto", profiling_peak_bytes=150)
    assert caught.value.with_host_memory_for_all_bytes is None
    assert plan_swaps(profile, 150, policy="auto", profiling_peak_bytes=150).recomputed


def test_above_the_profiling_floor_recomputation_serves_speed():
    """Between the profiling pass's peak and the unconstrained peak, a slow link makes the
    recomputing plan the faster one, and auto picks it."""
    profile = _blocks(6, link=2 * GB)
    floor = swap_everything_peak_bytes(profile)
    budget = min_budget_bytes(profile, policy="recompute")
    assert floor <= budget < profile.unconstrained_peak_bytes
    auto, swap = plan_swaps(profile, budget, policy="auto"), plan_swaps(profile, budget, policy="swap")
    assert auto.recomputed and auto.predicted_step_seconds < swap.predicted_step_seconds


def test_the_transient_of_a_recomputed_segment_counts_while_its_backward_runs():
    layers = (
        LayerProfile("stem", 50, 50, 1.0, 1.0),
        LayerProfile("block.a", 100, 100, 1.0, 2.0),
        LayerProfile("block.b", 100, 100, 1.0, 2.0),
    )
    profile = StepProfile(layers, static_bytes=10, segments=(SegmentProfile("block", 50),))
    step = recomputed_profile(profile, candidate_spans(profile))
    assert [layer.name for layer in step.profile.layers] == ["stem", "block"]
    assert step.transient_bytes == (0, 200)
    block = step.profile.layers[1]
    assert (block.saved_bytes, block.swappable_bytes) == (50, 0)
    assert block.backward_seconds == (1.0 + 1.0) + (2.0 + 2.0)  # the forward again, then the backward
    memory = Simulator(step.profile, step.transient_bytes).memory(PlanChoice((False, False)))
    assert memory.forward_levels == (60, 110)
    assert memory.backward_levels == (60, 10 + 50 + 50 + 200)


def test_a_recomputed_segment_s_weight_copies_are_let_go_from_the_backward_levels_before_its_own():
    """Autocast's weight copies (30 B in "block.a", counted in the static 100 B) of a recomputed
    block: the cache lets them go when the forward ends and the recomputation makes them again.
    The head's backward, before the block's, holds 30 B less; the block's own and the stem's
    levels are as measured (its copies alive again, and let go in the measured pass too)."""
    layers = (
        LayerProfile("stem", 50, 50),
        LayerProfile("block.a", 100, 100, weight_copy_bytes=30),
        LayerProfile("block.b", 100, 100),
        LayerProfile("head", 20, 20),
    )
    profile = StepProfile(layers, static_bytes=100, segments=(SegmentProfile("block", 50),))
    step = recomputed_profile(profile, candidate_spans(profile))
    assert [layer.name for layer in step.profile.layers] == ["stem", "block", "head"]
    assert step.profile.static_let_go_in_backward == (0, 0, 30)
    plain = recomputed_profile(
        replace(profile, layers=(layers[0], replace(layers[1], weight_copy_bytes=0), *layers[2:])),
        candidate_spans(profile),
    )
    kept = PlanChoice((False,) * 3)
    memory = Simulator(step.profile, step.transient_bytes).memory(kept)
    before = Simulator(plain.profile, plain.transient_bytes).memory(kept)
    assert memory.forward_levels == before.forward_levels
    assert memory.backward_levels == (
        before.backward_levels[0],
        before.backward_levels[1],
        before.backward_levels[2] - 30,
    )
    with pytest.raises(ValueError, match="static_let_go_in_backward"):
        StepProfile(layers, static_bytes=100, static_let_go_in_backward=(0, 101, 0, 0))


def test_a_storage_first_saved_inside_a_recomputed_segment_stays_counted():
    """The block's output, saved again by the head: under recomputation the engine sees the head
    save it first, so its bytes must not vanish with the block's layers."""
    layers = (
        LayerProfile("block.a", 100, 100, resaved_by=(("head", 40),)),
        LayerProfile("head", 5, 5),
    )
    profile = StepProfile(layers, static_bytes=0, segments=(SegmentProfile("block", 10),))
    step = recomputed_profile(profile, candidate_spans(profile))
    head = step.profile.layers[1]
    assert (head.saved_bytes, head.resident_bytes) == (45, 40)


# -- brute force ---------------------------------------------------------------------------

_seconds = st.sampled_from([0.0, 0.5, 1.0, 2.0])


@st.composite
def segmented_profiles(draw) -> StepProfile:
    """A stem, one or two blocks of one or two layers inside a group, a head: nested segments."""
    names = ["stem"]
    for block in range(draw(st.integers(1, 2))):
        names += [f"group.b{block}.l{i}" for i in range(draw(st.integers(1, 2)))]
    names.append("head")
    layers = []
    for name in names:
        saved = draw(st.integers(0, 100))
        swappable = draw(st.one_of(st.just(saved), st.integers(0, saved)))
        layers.append(LayerProfile(name, saved, swappable, draw(_seconds), draw(_seconds)))
    blocks = sorted({name.rsplit(".", 1)[0] for name in names if name.startswith("group.")})
    segments = tuple(SegmentProfile(name, draw(st.integers(0, 60))) for name in ["group", *blocks])
    link = draw(st.sampled_from([float("inf"), 25.0, 100.0]))
    return StepProfile(tuple(layers), draw(st.integers(0, 50)), link, link, segments=segments)


def _brute_force(profile: StepProfile, cap: int, policy: str) -> tuple[float | None, int]:
    """Least step time with peak <= cap, and least peak, over every non-overlapping recompute
    set (of the candidates and of the stages recomputed with their blocks recomputed inside them,
    as the planner offers them) x swap set x limit x window (written without the search)."""
    spans: tuple[SegmentSpan, ...] = ()
    if policy != "swap":
        flat = candidate_spans(profile)
        spans = (*flat, *nested_spans(profile, flat))
    best, least = None, None
    for mask in range(1 << len(spans)):
        chosen = [span for bit, span in enumerate(spans) if mask >> bit & 1]
        if any(a.overlaps(b) for a, b in itertools.combinations(chosen, 2)):
            continue
        step = recomputed_profile(profile, chosen, swappable=policy != "recompute")
        simulator = Simulator(step.profile, step.transient_bytes)
        for swap in itertools.product((False, True), repeat=len(step.profile.layers)):
            if any(
                s and not layer.swappable_bytes for s, layer in zip(swap, step.profile.layers, strict=True)
            ):
                continue
            sums = run_sums(step.profile, swap)
            for limit in [*sums, None]:
                for window in sums:
                    result = simulator.run(PlanChoice(swap, window, limit))
                    least = result.peak_bytes if least is None else min(least, result.peak_bytes)
                    if result.peak_bytes <= cap and (best is None or result.step_seconds < best):
                        best = result.step_seconds
    assert least is not None
    return best, least


@settings(max_examples=25, deadline=None)
@given(segmented_profiles(), st.floats(0.0, 1.0), st.sampled_from(["auto", "recompute", "swap"]))
def test_equal_to_brute_force_on_small_instances(profile, fraction, policy):
    """The least time of any plan within the budget, written without the search; no plan's budget
    is below the profiling pass's peak (the least peak of swap-only plans, from the brute force)."""
    budget = int(profile.static_bytes + fraction * profile.saved_bytes)
    best, least = _brute_force(profile, budget, policy)
    floor = _brute_force(profile, budget, "swap")[1]
    smallest = max(least, floor)
    assert min_budget_bytes(profile, policy=policy) == smallest
    if budget < floor:
        best = None
    if best is None:
        with pytest.raises(BudgetTooSmallError) as caught:
            plan_swaps(profile, budget, policy=policy)
        assert caught.value.min_budget_bytes == smallest
        return
    plan = plan_swaps(profile, budget, policy=policy)
    assert plan.search in ("exhaustive", "nothing to swap")
    assert plan.predicted_step_seconds == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert plan.predicted_peak_bytes <= budget
    assert plan.min_budget_bytes == smallest
    assert plan.predicted_step_seconds >= plan.lower_bound_seconds * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(segmented_profiles(), st.data())
def test_nothing_swapped_is_never_slower_than_a_plan_of_the_same_recompute_set(profile, data):
    """What the search's pruning of recompute sets relies on: waits only add to the compute stream."""
    chosen = data.draw(st.sampled_from(recompute_sets(candidate_spans(profile))))
    step = recomputed_profile(profile, chosen, swappable=True)
    simulator = Simulator(step.profile, step.transient_bytes)
    swap = tuple(data.draw(st.booleans()) for _ in step.profile.layers)
    sums = sorted(run_sums(step.profile, swap))
    choice = PlanChoice(swap, data.draw(st.sampled_from(sums)), data.draw(st.sampled_from([*sums, None])))
    compute_only = simulator.run(PlanChoice((False,) * len(swap), 0, 0)).step_seconds
    assert compute_only <= simulator.run(choice).step_seconds * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    segmented_profiles(),
    st.sampled_from(["auto", "recompute", "swap"]),
    st.integers(0, 20),
    st.one_of(st.none(), st.integers(0, 600)),
)
def test_the_smallest_budget_covers_the_profiling_pass_and_plans_exactly(profile, policy, reserve, measured):
    """For every policy: never below the profiling pass's peak (computed, or the measured one
    given); ``plan_swaps`` succeeds at exactly the smallest budget and refuses one byte less,
    naming it."""
    floor = swap_everything_peak_bytes(profile) if measured is None else measured
    smallest = min_budget_bytes(profile, reserve, policy, profiling_peak_bytes=measured)
    assert smallest >= floor + reserve
    plan = plan_swaps(profile, smallest, reserve, policy=policy, profiling_peak_bytes=measured)
    assert plan.predicted_peak_bytes <= smallest - reserve
    assert plan.min_budget_bytes == smallest and plan.profiling_peak_bytes == floor
    with pytest.raises(BudgetTooSmallError) as caught:
        plan_swaps(profile, smallest - 1, reserve, policy=policy, profiling_peak_bytes=measured)
    assert caught.value.min_budget_bytes == smallest
