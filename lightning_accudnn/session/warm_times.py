"""Layer times from warm passes: the first planned passes of a kind are timed again, and each
layer keeps the fastest time measured.

The first passes of a process run cold: the allocator grows (each new block a synchronising
``cudaMalloc``), kernels are chosen and libraries load, pinned buffers are allocated. Their
layer times are not the steady state's. On an H200 a session keeping everything learnt 137.4 ms
of compute from its second pass, which took 421 ms of wall time, for a ResNet-152 step that then
ran in 60.4 ms (``bench/results/nvidia-h200``, ``bench.calibration``). So a kind's plan is
refined (its pass runs hooked and timed) until :data:`TIMED_PLANNED_PASSES` planned passes were
timed, a count every rank reaches at the same pass, and the times planned from are the fastest
seen per layer (:func:`fastest_times`).

Recomputations are timed in the passes replayed under a plan that recomputes
(:mod:`~lightning_accudnn.session.steady_costs`); each segment keeps its fastest
(:func:`fastest_recomputations`), and :func:`recompute_cost_ratio` sets them against the forward
time the profile planned from gives the layers run again: on a GPU whose host issues the
recomputed kernels in backward more slowly than the device runs them, a recomputation takes
several times the forward it repeats. Plans charge a segment timed its fastest recomputation,
and the others the ratio times their forward (:func:`with_recomputations`). A plan whose
recomputation, charged so, would take its step more than :data:`RECOMPUTE_COST_TOLERANCE` away
from what it predicted is made again (:func:`recompute_cost_departs`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace

from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.planner.recompute import SegmentSpan, policy_spans
from lightning_accudnn.profile import LayerProfile, SegmentProfile

__all__ = [
    "RECOMPUTE_COST_TOLERANCE",
    "TIMED_PLANNED_PASSES",
    "fastest_recomputations",
    "compute_departs",
    "fastest_times",
    "recompute_cost_departs",
    "recompute_cost_ratio",
    "scaled_backward",
    "scaled_forward",
    "scaled_to_forward",
    "swap_host_departs",
    "with_recomputations",
]

#: Planned passes of a kind timed layer by layer before its plan is final: the first runs
#: right after the profiling pass, often still cold.
TIMED_PLANNED_PASSES = 2

#: The share of its predicted step by which a plan's recomputation, charged at the ratio measured
#: since it was made, may move before the plan is made again: the 15 % a step prediction may be off.
RECOMPUTE_COST_TOLERANCE = 0.15


def fastest_times(measured: StepProfile, earlier: StepProfile) -> StepProfile:
    """``measured`` with each layer's forward and backward time the faster of its own and
    ``earlier``'s (the same layers, in order: else ``measured`` as it is); a time ``earlier``
    does not hold (zero) is no faster.

    Example:
        >>> old = StepProfile((LayerProfile("a", 8, 8, 3.0, 6.0), LayerProfile("b", 8, 8, 1.0, 2.0)), 0)
        >>> new = StepProfile((LayerProfile("a", 8, 8, 1.0, 2.0), LayerProfile("b", 8, 8, 2.0, 1.0)), 0)
        >>> [(layer.forward_seconds, layer.backward_seconds) for layer in fastest_times(new, old).layers]
        [(1.0, 2.0), (1.0, 1.0)]
    """
    if [layer.name for layer in measured.layers] != [layer.name for layer in earlier.layers]:
        return measured
    layers = tuple(
        _with_times(
            layer,
            _faster(layer.forward_seconds, before.forward_seconds),
            _faster(layer.backward_seconds, before.backward_seconds),
        )
        for layer, before in zip(measured.layers, earlier.layers, strict=True)
    )
    return replace(measured, layers=layers)


def scaled_to_forward(profile: StepProfile, forward_seconds: float) -> StepProfile:
    """``profile`` with every time scaled down so that its forward takes ``forward_seconds``,
    when that is less but not nothing (a pass whose layers cannot be timed one by one, as under
    a plan that recomputes: its forward is the same work, its backward is not).

    Example:
        >>> profile = StepProfile((LayerProfile("a", 8, 8, 4.0, 8.0),), 0)
        >>> scaled_to_forward(profile, 1.0).layers[0].backward_seconds
        2.0
        >>> scaled_to_forward(profile, 5.0) is profile, scaled_to_forward(profile, 0.0) is profile
        (True, True)
    """
    return _forward_scaled_down(profile, forward_seconds, backward_too=True)


def scaled_forward(profile: StepProfile, forward_seconds: float) -> StepProfile:
    """``profile`` with every layer's forward time scaled down so that they add up to
    ``forward_seconds``, when that is less but not nothing; backward times as they are. A pass
    replayed without hooks times its forward whole; a hooked pass's module hooks slow the
    forward it times layer by layer (on a GPU whose host issues the forward, that is the
    forward's time), not its backward.

    Example:
        >>> profile = StepProfile((LayerProfile("a", 8, 8, 4.0, 8.0), LayerProfile("b", 8, 8, 4.0, 2.0)), 0)
        >>> [(layer.forward_seconds, layer.backward_seconds) for layer in scaled_forward(profile, 4.0).layers]
        [(2.0, 8.0), (2.0, 2.0)]
        >>> scaled_forward(profile, 9.0) is profile, scaled_forward(profile, 0.0) is profile
        (True, True)
    """
    return _forward_scaled_down(profile, forward_seconds, backward_too=False)


def _forward_scaled_down(profile: StepProfile, forward_seconds: float, *, backward_too: bool) -> StepProfile:
    """``profile`` with its forward times (and its backward times, ``backward_too``) scaled by
    the factor that makes the forward add up to ``forward_seconds``, when that is less but not
    nothing; else ``profile`` itself."""
    total = sum(layer.forward_seconds for layer in profile.layers)
    if forward_seconds <= 0.0 or forward_seconds >= total:
        return profile
    scale = forward_seconds / total
    backward_scale = scale if backward_too else 1.0
    layers = tuple(
        _with_times(layer, layer.forward_seconds * scale, layer.backward_seconds * backward_scale)
        for layer in profile.layers
    )
    return replace(profile, layers=layers)


def compute_departs(plan: Plan, profile: StepProfile) -> bool:
    """Whether ``profile``'s compute (forward and backward) differs from the compute ``plan``
    was made from by more than :data:`RECOMPUTE_COST_TOLERANCE` of its predicted step (the plan
    then misjudges what its copies hide behind, and what recomputing costs against copying).

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> profile = StepProfile((LayerProfile("a", 8, 8, 4.0, 8.0),), 0)
        >>> plan = plan_swaps(profile, 10**6)
        >>> [compute_departs(plan, scaled_forward(profile, forward)) for forward in (3.0, 2.0)]
        [False, True]
        >>> compute_departs(plan, scaled_backward(profile, 10.0))
        True
    """
    planned = sum(layer.forward_seconds + layer.backward_seconds for layer in plan.profile.layers)
    measured = sum(layer.forward_seconds + layer.backward_seconds for layer in profile.layers)
    return abs(planned - measured) > RECOMPUTE_COST_TOLERANCE * plan.predicted_step_seconds


def swap_host_departs(plan: Plan, profile: StepProfile) -> bool:
    """Whether the host's time per swapped storage ``profile`` charges
    (:attr:`~lightning_accudnn.profile.StepProfile.swap_host_seconds`) moves ``plan``'s predicted
    step, over the storages it swaps, by more than :data:`RECOMPUTE_COST_TOLERANCE` of it from
    what it was charged (the plan then misjudges many small copies against a few large ones).

    Example:
        >>> from dataclasses import replace
        >>> from lightning_accudnn.planner import plan_swaps
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1.0, 1.0, swappable_storages=3) for i in range(4))
        >>> plan = plan_swaps(StepProfile(layers, 0), 250)
        >>> len(plan.swapped_layers), plan.predicted_step_seconds
        (4, 8.0)
        >>> [swap_host_departs(plan, replace(plan.profile, swap_host_seconds=(s, s))) for s in (0.04, 0.06)]
        [False, True]
    """
    charged, measured = sum(plan.profile.swap_host_seconds), sum(profile.swap_host_seconds)
    moved = plan.swapped_storages * abs(measured - charged)
    return moved > RECOMPUTE_COST_TOLERANCE * plan.predicted_step_seconds


def recompute_cost_ratio(profile: StepProfile, seconds: Mapping[tuple[str, bool], float]) -> float | None:
    """What recomputing the segments in ``seconds`` took (keyed ``(segment, selectively)``, as
    timed), over what ``profile`` gives them: the forward time each candidate span runs again
    (:attr:`~lightning_accudnn.planner.recompute.SegmentSpan.forward_again_seconds`). ``None``
    when nothing comparable was timed.

    Example:
        >>> from lightning_accudnn.profile import SegmentProfile
        >>> layers = (LayerProfile("block.conv", 8, 8, 1.0), LayerProfile("block.relu", 8, 8, 1.0))
        >>> profile = StepProfile(layers, 0, segments=(SegmentProfile("block", 8),))
        >>> recompute_cost_ratio(profile, {("block", False): 3.0})
        1.5
        >>> recompute_cost_ratio(profile, {("unknown", False): 3.0}) is None
        True
    """
    spans = _spans(profile)
    modelled = measured = 0.0
    for key, taken in seconds.items():
        span = spans.get(key)
        if span is None:
            continue
        modelled += span.forward_again_seconds
        measured += taken
    if modelled <= 0.0 or measured <= 0.0:
        return None
    return measured / modelled


def recompute_cost_departs(plan: Plan, profile: StepProfile) -> bool:
    """Whether ``plan``'s recomputation, charged as ``profile`` charges it (each segment its
    timed recomputation, or the cost ratio times its forward), moves its predicted step by more
    than :data:`RECOMPUTE_COST_TOLERANCE` of it.

    Example:
        >>> from dataclasses import replace
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import SegmentProfile
        >>> layers = tuple(LayerProfile(f"b{i}.x", 100, 100, 1.0, 2.0) for i in range(4))
        >>> segments = tuple(SegmentProfile(f"b{i}", 10) for i in range(4))
        >>> profile = StepProfile(layers, 0, segments=segments)
        >>> plan = plan_swaps(profile, 330, policy="recompute")
        >>> plan.recomputed, plan.recompute_seconds, plan.predicted_step_seconds
        (('b0',), 1.0, 13.0)
        >>> recompute_cost_departs(plan, replace(profile, recompute_cost_ratio=3.0))
        True
        >>> timed = replace(segments[0], recompute_seconds=2.0)
        >>> recompute_cost_departs(plan, replace(profile, segments=(timed, *segments[1:])))
        False
    """
    spans = _spans(profile)
    charged = 0.0
    for name in plan.recomputed:
        span = spans.get((name, name in plan.selective))
        if span is None:  # not a candidate of this profile: as the plan charged it
            return False
        charged += span.own_recompute_seconds
    moved = abs(charged - plan.recompute_seconds)
    return moved > RECOMPUTE_COST_TOLERANCE * plan.predicted_step_seconds


def _spans(profile: StepProfile) -> dict[tuple[str, bool], SegmentSpan]:
    """``profile``'s recomputation candidates, whole and selective, keyed ``(segment, selectively)``."""
    return {(span.name, span.selective): span for span in policy_spans(profile, "auto")}


def with_recomputations(
    profile: StepProfile, seconds: Mapping[tuple[str, bool], float], ratio: float | None
) -> StepProfile:
    """``profile`` charging recomputation as timed: each segment in ``seconds`` (keyed
    ``(segment, selectively)``) what it took, the others ``ratio`` times their forward (``None``:
    the profile's ratio). ``profile`` itself when that changes nothing.

    Example:
        >>> from lightning_accudnn.profile import SegmentProfile
        >>> profile = StepProfile((LayerProfile("b.x", 8, 8, 1.0),), 0, segments=(SegmentProfile("b", 4),))
        >>> timed = with_recomputations(profile, {("b", False): 2.5}, 2.0)
        >>> timed.segments[0].recompute_seconds, timed.recompute_cost_ratio
        (2.5, 2.0)
        >>> with_recomputations(timed, {("b", False): 2.5}, 2.0) is timed
        True
    """
    segments = tuple(_timed(segment, seconds) for segment in profile.segments)
    cost_ratio = profile.recompute_cost_ratio if ratio is None else ratio
    if segments == profile.segments and cost_ratio == profile.recompute_cost_ratio:
        return profile
    return replace(profile, segments=segments, recompute_cost_ratio=cost_ratio)


def _timed(segment: SegmentProfile, seconds: Mapping[tuple[str, bool], float]) -> SegmentProfile:
    whole = seconds.get((segment.name, False), segment.recompute_seconds)
    selective = seconds.get((segment.name, True), segment.selective_recompute_seconds)
    if whole == segment.recompute_seconds and selective == segment.selective_recompute_seconds:
        return segment
    return replace(segment, recompute_seconds=whole, selective_recompute_seconds=selective)


def fastest_recomputations(
    recomputations: Iterable[tuple[str, float]],
    selective: Collection[str],
    earlier: Mapping[tuple[str, bool], float],
) -> dict[tuple[str, bool], float]:
    """``earlier`` with each segment's recomputation in this pass (``(segment, seconds)``, summed
    per segment; recomputed selectively when named in ``selective``) where it is faster or new.

    Example:
        >>> fastest_recomputations([("a", 2.0), ("b", 5.0)], (), {("a", False): 3.0, ("b", False): 4.0})
        {('a', False): 2.0, ('b', False): 4.0}
    """
    this_pass: dict[tuple[str, bool], float] = {}
    for name, taken in recomputations:
        key = (name, name in selective)
        this_pass[key] = this_pass.get(key, 0.0) + taken
    fastest = dict(earlier)
    for key, taken in this_pass.items():
        fastest[key] = min(taken, fastest.get(key, taken))
    return fastest


def scaled_backward(profile: StepProfile, backward_seconds: float) -> StepProfile:
    """``profile`` with every layer's backward time scaled so that they add up to
    ``backward_seconds`` (up or down; nothing measured, ``0``: ``profile`` as it is). A pass
    under a plan that recomputes times its backward whole: less its recomputations, that is the
    backward the plan's profile holds.

    Example:
        >>> profile = StepProfile((LayerProfile("a", 8, 8, 1.0, 2.0), LayerProfile("b", 8, 8, 1.0, 6.0)), 0)
        >>> [layer.backward_seconds for layer in scaled_backward(profile, 12.0).layers]
        [3.0, 9.0]
        >>> scaled_backward(profile, 0.0) is profile
        True
    """
    total = sum(layer.backward_seconds for layer in profile.layers)
    if backward_seconds <= 0.0 or total <= 0.0 or backward_seconds == total:
        return profile
    scale = backward_seconds / total
    layers = tuple(
        _with_times(layer, layer.forward_seconds, layer.backward_seconds * scale) for layer in profile.layers
    )
    return replace(profile, layers=layers)


def _faster(measured: float, earlier: float) -> float:
    return earlier if 0.0 < earlier < measured else measured


def _with_times(layer: LayerProfile, forward_seconds: float, backward_seconds: float) -> LayerProfile:
    if forward_seconds == layer.forward_seconds and backward_seconds == layer.backward_seconds:
        return layer
    return replace(layer, forward_seconds=forward_seconds, backward_seconds=backward_seconds)
