"""What a pass run under a plan that recomputes tells the session.

Under recomputation the engine sees fewer layers than the profiling pass did (a recomputed
segment's inner saves go to the checkpoint; the segment saves only its inputs), so its
measured profile cannot be planned from: the session keeps planning from the profile the
plan was made from, with the bytes its layers were seen to save where they saved more (a plan
scaled from another batch shape counts estimates), unless the pass departed from the layers
the plan expects the engine to see.
"""

from __future__ import annotations

from dataclasses import replace

from lightning_accudnn.ops import SwapSchedule
from lightning_accudnn.planner import Plan
from lightning_accudnn.profile import SegmentProfile, StepProfile

__all__ = ["departs_from_plan", "profile_to_plan_from", "recomputable_segments", "schedule_for"]


def schedule_for(plan: Plan) -> SwapSchedule:
    """The engine's orders for a pass under ``plan``.

    A plan that recomputes nothing keeps what it chose to keep and swaps the rest (a layer it
    never saw is swapped, the safe side). Under recomputation layers the profiling pass never
    saw save for the first time (a recomputed segment's output, saved by the layer after it):
    the plan counts those bytes as kept by the layer after the segment, so the schedule
    swaps exactly the layers the plan swaps and keeps every other (the layers inside a
    segment recomputed selectively too: what they save there is what the plan keeps).

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile
        >>> plan = plan_swaps(StepProfile((LayerProfile("a", 100, 100),), 0), 1_000)
        >>> schedule_for(plan).swaps("a"), schedule_for(plan).swaps("new")
        (False, True)
    """
    window, limit = plan.prefetch_window_bytes, plan.max_copying_out_bytes
    if plan.recomputed:
        return SwapSchedule.swap_layers_named(plan.swapped_layers, window, limit)
    return SwapSchedule.keep_layers_named(plan.kept_layers, window, limit)


def departs_from_plan(plan: Plan, measured: StepProfile) -> bool:
    """Whether ``measured`` (a pass run under ``plan``) saw the plan's layers out of order, a
    layer saving more bytes than the plan counts for it, or more bytes in all.

    A layer may be missing (it saved only storages saved before, which the engine counts
    once) and may save less (the plan counts a segment's inputs even when they were saved
    before); a layer the plan does not list may save what the plan counts elsewhere (a
    recomputed segment's output, first saved by a layer the profiling pass saw save nothing).
    Inside a segment recomputed selectively the engine sees what the expensive ops keep,
    saved by the layers inside it: those count as the segment's layer.

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"{block}.{op}", 100, 100) for block in ("one", "two") for op in "ab")
        >>> segments = (SegmentProfile("one", 10), SegmentProfile("two", 10))
        >>> plan = plan_swaps(StepProfile(layers, 0, segments=segments), 300, policy="recompute")
        >>> plan.recomputed
        ('one',)
        >>> departs_from_plan(plan, StepProfile((LayerProfile("one", 10, 10),) + layers[2:], 0))
        False
        >>> departs_from_plan(plan, StepProfile((LayerProfile("one", 20, 20),) + layers[2:], 0))
        True
    """
    return _departure(plan, measured) is not None


def _departure(plan: Plan, measured: StepProfile) -> str | None:
    """How ``measured`` departs from ``plan`` (:func:`departs_from_plan`): ``"layers"`` (the
    plan's layers out of order, or more bytes in all than the plan's layers saved beyond what it
    counts for them), ``"bytes"`` (in order, some saving more than the plan counts for them, and
    no more in all than that), or ``None``."""
    expected = {layer.name: (i, layer.saved_bytes) for i, layer in enumerate(plan.engine_profile.layers)}
    position, beyond = -1, 0
    for name, saved_bytes in _selective_folded(plan, measured):
        known = expected.get(name)
        if known is None:
            continue
        if known[0] <= position:
            return "layers"
        beyond += max(0, saved_bytes - known[1])
        position = known[0]
    if measured.saved_bytes - plan.engine_profile.saved_bytes > beyond:
        return "layers"
    return "bytes" if beyond else None


def _selective_folded(plan: Plan, measured: StepProfile) -> list[tuple[str, int]]:
    """``(layer, saved bytes)`` of ``measured``, the layers inside a segment the plan recomputes
    selectively (whose kept outputs the engine sees there) counted as that segment's layer."""
    segments = [SegmentProfile(name, 0) for name in plan.selective]
    folded: list[tuple[str, int]] = []
    for layer in measured.layers:
        owner = next((segment.name for segment in segments if segment.covers(layer.name)), None)
        if owner is not None and folded and folded[-1][0] == owner:
            folded[-1] = (owner, folded[-1][1] + layer.saved_bytes)
        else:
            folded.append((owner or layer.name, layer.saved_bytes))
    return folded


def profile_to_plan_from(plan: Plan | None, measured: StepProfile, graph_changed: bool) -> StepProfile:
    """The profile to plan the next passes from, after a pass run under ``plan`` measured
    ``measured``: the plan's own profile when the plan recomputes and the pass ran as it
    expects (or was replayed by ordinal and departed: the next pass runs hooked and checks);
    when it recomputes and its layers saved more than the plan counts for them, in the plan's
    order (a plan made from another batch shape's profile, scaled, counts its estimates), the
    plan's own profile with those layers' bytes raised to what they saved (the layers inside a
    recomputed segment, unseen, as the plan counts them); else ``measured`` with the segments
    the plan's profile found (only a profiling pass finds segments).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> measured = StepProfile((LayerProfile("a", 1, 1),), 0)
        >>> profile_to_plan_from(None, measured, graph_changed=False) is measured
        True
    """
    if plan is None:
        return measured
    if plan.recomputed:
        departure = _departure(plan, measured)
        if graph_changed or departure is None:
            return plan.profile
        if departure == "bytes":
            return _with_bytes_saved(plan.profile, measured)
    return replace(measured, segments=plan.profile.segments, excluded_segments=plan.profile.excluded_segments)


def _with_bytes_saved(profile: StepProfile, measured: StepProfile) -> StepProfile:
    """``profile`` with each layer that ``measured`` saw save more (by name) raised to that: its
    saved and swappable bytes each the larger of the two.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> profile = StepProfile((LayerProfile("a", 100, 80), LayerProfile("b", 50, 50)), 0)
        >>> raised = _with_bytes_saved(profile, StepProfile((LayerProfile("a", 110, 90),), 0))
        >>> [(layer.saved_bytes, layer.swappable_bytes) for layer in raised.layers]
        [(110, 90), (50, 50)]
    """
    seen = {layer.name: layer for layer in measured.layers}
    layers = []
    for layer in profile.layers:
        other = seen.get(layer.name)
        if other is not None and other.saved_bytes > layer.saved_bytes:
            layer = replace(
                layer,
                saved_bytes=other.saved_bytes,
                swappable_bytes=max(layer.swappable_bytes, other.swappable_bytes),
            )
        layers.append(layer)
    return replace(profile, layers=tuple(layers))


def recomputable_segments(
    segments: tuple[SegmentProfile, ...], layers_read_in_forward: frozenset[str]
) -> tuple[SegmentProfile, ...]:
    """``segments`` but those holding a layer whose saves a backward inside the forward read.

    Such a backward (a gradient penalty: ``autograd.grad(..., create_graph=True)`` in the
    training step) would recompute the segment, and the graph it creates keeps the
    recomputed saves alive until the step's backward: the plan would not count them.

    Example:
        >>> segments = (SegmentProfile("blocks.0", 10), SegmentProfile("blocks.1", 10))
        >>> recomputable_segments(segments, frozenset({"blocks.1.conv"}))
        (SegmentProfile(name='blocks.0', input_bytes=10, output_bytes=0),)
    """
    if not layers_read_in_forward:
        return segments
    return tuple(
        segment
        for segment in segments
        if not any(
            layer == segment.name or layer.startswith(f"{segment.name}.") for layer in layers_read_in_forward
        )
    )
