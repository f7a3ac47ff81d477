"""The lower bound a plan's step is judged against: no plan under the budget runs faster."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_accudnn.planner.frontier import recompute_cost_lines
from lightning_accudnn.planner.recompute import policy_spans
from lightning_accudnn.planner.search import KEEP_OR_RECOMPUTE, check_policy
from lightning_accudnn.profile import StepProfile

__all__ = ["lower_bound_seconds"]


def lower_bound_seconds(profile: StepProfile, budget_bytes: int, policy: str = "swap") -> float:
    """Physical lower bound on the step time under ``budget_bytes`` (docs/design.md, the performance model).

    ``X = max(0, unconstrained peak - budget)`` bytes must be off the device when the forward
    ends. Swapping ``x`` of them costs ``x / bw_out`` in forward and ``x / bw_in`` in backward
    (copies hidden perfectly behind compute); recomputing frees the rest, ``y = X - x``, at
    the least forward time that frees ``y`` bytes, ``R(y)`` (bounded from below by the
    Lagrangian relaxation of choosing non-overlapping segments, a stage never with its blocks:
    :func:`~lightning_accudnn.planner.frontier.recompute_cost_lines`), added to the backward:
    ``LB = min over x of max(T_fwd, x / bw_out) + max(T_bwd + R(X - x), x / bw_in)``, with
    ``x = X`` under policy ``"swap"`` (``LB = max(T_fwd, X/bw_out) + max(T_bwd, X/bw_in)``) and
    ``x = 0`` under ``"recompute"`` and ``"selective"``. It ignores the transient a recomputed
    segment holds and the bytes a plan cannot move, so every plan is at least this slow. A nested
    set (a stage recomputed with its blocks recomputed again inside it) frees at the end of the
    forward what the stage alone frees, at more recompute time, so the relaxation over
    non-overlapping sets bounds it too.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 400, 400, 1.0, 2.0),), static_bytes=100,
        ...                       d2h_bytes_per_second=100.0, h2d_bytes_per_second=50.0)
        >>> lower_bound_seconds(profile, budget_bytes=200)  # X = 300: max(1, 3) + max(2, 6)
        9.0
    """
    check_policy(policy)
    excess = max(0, profile.unconstrained_peak_bytes - budget_bytes)
    forward = float(sum(layer.forward_seconds for layer in profile.layers))
    backward = float(sum(layer.backward_seconds for layer in profile.layers))
    if excess == 0:
        return forward + backward

    lines, most = recompute_cost_lines(policy_spans(profile, policy))

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
