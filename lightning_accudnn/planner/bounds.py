"""The lower bound a plan's step is judged against: no plan under the budget runs faster."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_accudnn.planner.frontier import recompute_cost_lines
from lightning_accudnn.planner.recompute import SegmentSpan, innermost_segments, policy_spans, resaved_inside
from lightning_accudnn.planner.search import KEEP_OR_RECOMPUTE, check_policy
from lightning_accudnn.profile import StepProfile

__all__ = ["FreedBound", "lower_bound_seconds"]


def lower_bound_seconds(profile: StepProfile, budget_bytes: int, policy: str = "swap") -> float:
    """Physical lower bound on the step time under ``budget_bytes`` (docs/design.md, the performance model).

    ``X = max(0, unconstrained peak + working - budget)`` bytes must be off the device when the
    forward ends, ``working`` being the last layer's working memory (the larger of its forward
    and backward working bytes: its forward and backward run with every byte not off the
    device on it, and a recomputed segment holding it holds at least as much). Swapping ``x``
    of them costs ``x / bw_out`` in forward and ``x / bw_in`` in backward
    (copies hidden perfectly behind compute); recomputing frees the rest, ``y = X - x``, at
    the least forward time that frees ``y`` bytes, ``R(y)`` (bounded from below by the
    Lagrangian relaxation of choosing non-overlapping segments, a stage never with its blocks:
    :func:`~lightning_accudnn.planner.frontier.recompute_cost_lines`, with what a set frees
    bounded from above by :class:`FreedBound`), added to the backward:
    ``LB = min over x of max(T_fwd, x / bw_out) + max(T_bwd + R(X - x), x / bw_in)``, with
    ``x = X`` under policy ``"swap"`` (``LB = max(T_fwd, X/bw_out) + max(T_bwd, X/bw_in)``) and
    ``x = 0`` under ``"recompute"`` and ``"selective"``. It ignores the transient a recomputed
    segment holds and the bytes a plan cannot move, so every plan is at least this slow. A nested
    set (a stage recomputed with its blocks recomputed again inside it) frees at the end of the
    forward what the stage alone frees, at more recompute time, so the relaxation over
    non-overlapping sets bounds it too (:class:`FreedBound`).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 400, 400, 1.0, 2.0),), static_bytes=100,
        ...                       d2h_bytes_per_second=100.0, h2d_bytes_per_second=50.0)
        >>> lower_bound_seconds(profile, budget_bytes=200)  # X = 300: max(1, 3) + max(2, 6)
        9.0
    """
    check_policy(policy)
    last = profile.layers[-1] if profile.layers else None
    working = max(last.forward_working_bytes, last.backward_working_bytes) if last is not None else 0
    excess = max(0, profile.unconstrained_peak_bytes + working - budget_bytes)
    forward = float(sum(layer.forward_seconds for layer in profile.layers))
    backward = float(sum(layer.backward_seconds for layer in profile.layers))
    if excess == 0:
        return forward + backward

    spans = policy_spans(profile, policy)
    lines, most = recompute_cost_lines(spans, FreedBound(profile, spans))

    def bound(swapped: float) -> float:
        recompute = _least_recompute_seconds(lines, most, excess - swapped)
        return max(forward, swapped / profile.d2h_bytes_per_second) + max(
            backward + recompute, swapped / profile.h2d_bytes_per_second
        )

    if policy == "swap":
        return bound(excess)
    if policy in KEEP_OR_RECOMPUTE:
        return bound(0.0)
    # Convex in the swapped bytes: a golden-section search finds the least value.
    low, high = 0.0, float(excess)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        left, right = high - ratio * (high - low), low + ratio * (high - low)
        if bound(left) <= bound(right):
            high = right
        else:
            low = left
    return min(bound(low), bound(high), bound(0.0), bound(float(excess)))


def _least_recompute_seconds(lines: Sequence[tuple[float, float]], most: int, freed: float) -> float:
    """A lower bound on the forward time run again that frees ``freed`` bytes: the maximum of
    :func:`~lightning_accudnn.planner.frontier.recompute_cost_lines`' lines, ``inf`` beyond the
    most bytes any set of non-overlapping segments frees."""
    if freed <= 0:
        return 0.0
    if freed > most:
        return math.inf
    return max(slope * freed + intercept for slope, intercept in lines)


class FreedBound:
    """What recomputing a set of ``spans`` of ``profile`` frees at the end of the forward, bounded
    from above for every non-overlapping set, nested ones included, as
    :data:`~lightning_accudnn.planner.frontier.FreedBytes`: ``bound(before, span)`` for ``span``
    recomputed right after ``before`` (``None``: a kept layer or the start is before it),
    ``bound(before, None)`` for kept layers after ``before``.

    Why it bounds: :func:`~lightning_accudnn.planner.recompute.recomputed_profile` gives a kept
    layer its saves plus what the recomputed span just before it leaves it, and a recomputed span
    ``t`` ``held(t) - min(inputs(t), covered(t))`` plus what the span just before leaves it.
    ``covered(t)`` is its input bytes that kept layers before it save, taken per earlier segment
    (``input_sources``) from re-saves into ``t`` of layers whose innermost segment that is; what
    a span ``s`` leaves (its re-saves and outputs saved again after it, less what the next span
    takes as inputs) depends on ``s`` and the group after it only. So a set frees, summed over
    its spans, ``saved(t) - held(t) + min(inputs(t), covered(t))`` less what each leaves.
    This counts what a span leaves exactly, and ``covered(t)`` as if every layer before ``t``
    (before ``s`` when ``s`` ends where ``t`` starts: ``s`` is not kept) were kept: the takes only
    grow with the kept layers, so it never counts less than the set frees. A nested span holds,
    is covered and leaves as its stage alone (same layers, inputs, outputs and name): the stage's
    figures bound it, at fewer recompute seconds.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = (LayerProfile("a", 100, 100, resaved_by=(("b.x", 100),)), LayerProfile("b.x", 300, 300),
        ...           LayerProfile("b.y", 50, 50, resaved_by=(("c", 50),)), LayerProfile("c", 10, 10))
        >>> segments = (SegmentProfile("a", 0, output_bytes=100),
        ...             SegmentProfile("b", 100, output_bytes=50, input_sources=(("a", 100),)))
        >>> profile = StepProfile(layers, 0, segments=segments)
        >>> b = SegmentSpan("b", 1, 2, 100, 350, 1.0, 50, (("a", 100),))
        >>> bound = FreedBound(profile, [b])
        >>> bound(None, b), bound(b, None)  # its input is layer a's save; c saves its output again
        (350, -50)
    """

    def __init__(self, profile: StepProfile, spans: Sequence[SegmentSpan]) -> None:
        self._profile = profile
        layers = profile.layers
        index = {layer.name: i for i, layer in enumerate(layers)}
        self._index = index
        innermost = innermost_segments(profile)
        # Re-saves a layer inside a segment makes of its bytes: (layer, its innermost segment,
        # the layer saving them again, bytes), in forward order.
        resaves = [
            (i, segment, index[later], nbytes)
            for i, segment in sorted(innermost.items())
            for later, nbytes in layers[i].resaved_by
        ]
        self._covering: dict[tuple[str, int, int], list[tuple[int, str, int]]] = {}
        for span in spans:
            sources = span.sources
            self._covering.setdefault(
                (span.name, span.first, span.last),
                [
                    (i, segment, nbytes)
                    for i, segment, later, nbytes in resaves
                    if i < span.first <= later <= span.last and segment in sources
                ],
            )

    def __call__(self, before: SegmentSpan | None, span: SegmentSpan | None) -> int:
        left = 0 if before is None else self.left_bytes(before, span)
        if span is None:
            return -left
        kept_before = span.first if before is None else before.first
        return span.saved_bytes - span.held_bytes + self.covered_bytes(span, kept_before) - left

    def covered_bytes(self, span: SegmentSpan, kept_before: int) -> int:
        """The most of ``span``'s inputs that layers before ``kept_before`` save first, as the
        accounting matches them (at most its inputs)."""
        entries = self._covering.get((span.name, span.first, span.last))
        if entries is None:
            raise ValueError(f"{span.name!r} is none of the spans this bound was made for")
        taken: dict[str, int] = {}
        for i, segment, nbytes in entries:
            if i < kept_before:
                taken[segment] = taken.get(segment, 0) + nbytes
        sources = span.sources
        return min(span.input_bytes, sum(min(sources[segment], nbytes) for segment, nbytes in taken.items()))

    def left_bytes(self, span: SegmentSpan, following: SegmentSpan | None) -> int:
        """What recomputed ``span`` leaves to the group after it (``following``, recomputed and
        starting right after it, or ``None``: the next layer, kept, or none): its saves saved
        again there or later, less what ``following`` takes as inputs, and its outputs saved
        again without a listed re-save, as the accounting counts them."""
        layers = self._profile.layers
        after = span.last + 1
        if after >= len(layers):
            return 0
        if following is not None and following.first != after:
            raise ValueError(f"{following.name!r} does not start right after {span.name!r}")
        end = after if following is None else following.last
        passed = 0 if following is None else following.sources.get(span.name, 0)
        leaving = left = 0
        for i in range(span.first, after):
            layer = layers[i]
            inside = resaved_inside(layer, span.name)
            for later_name, nbytes in layer.resaved_by:
                later = self._index[later_name]
                if span.first <= later <= span.last:
                    continue
                following_saves = after <= later <= end
                if inside and following_saves:
                    dropped = min(inside, nbytes)
                    inside, nbytes = inside - dropped, nbytes - dropped
                    if not nbytes:
                        continue
                leaving += nbytes
                if following_saves and following is not None:
                    taken = min(passed, nbytes)
                    passed, nbytes = passed - taken, nbytes - taken
                left += nbytes
        unlisted = max(0, span.output_bytes - leaving - passed)
        if self._profile.resaves_listed:
            unlisted = min(unlisted, sum(layers[i].resident_bytes for i in range(span.first, after)))
        return left + unlisted
