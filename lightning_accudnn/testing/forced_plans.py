"""Plans chosen by a test or a benchmark, not by the planner's search: what a replacement for
``lightning_accudnn.planner.plan.search_mixed`` returns to force a plan whatever the timings."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lightning_accudnn.planner.recompute import SegmentSpan, recomputed_profile
from lightning_accudnn.planner.search import MixedResult
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from lightning_accudnn.profile import LayerProfile, StepProfile

__all__ = ["FORCED_SWAP_WINDOW_BYTES", "forced_result"]

#: The prefetch window and copy-out limit of a forced plan that swaps: copies in flight while
#: compute goes on.
FORCED_SWAP_WINDOW_BYTES = 2**20


def forced_result(
    profile: StepProfile,
    spans: Sequence[SegmentSpan],
    swap: Callable[[LayerProfile], bool] | None = None,
) -> MixedResult:
    """The search result for the plan that recomputes ``spans`` whole, swaps the layers ``swap``
    picks among those the engine may swap under it, and keeps every other layer; a plan that
    swaps gets :data:`FORCED_SWAP_WINDOW_BYTES` of window and copy-out limit, one that does not
    none.

    Example:
        >>> layers = tuple(LayerProfile(name, 100, 100, 1e-3, 2e-3) for name in ("a", "b"))
        >>> result = forced_result(StepProfile(layers, 0), (), swap=lambda layer: layer.name == "b")
        >>> result.best.choice.swap, result.best.choice.prefetch_window_bytes
        ((False, True), 1048576)
    """
    step = recomputed_profile(profile, spans, swappable=swap is not None)
    simulator = Simulator(step.profile, step.transient_bytes)
    flags = tuple(swap is not None and swap(layer) for layer in step.profile.layers[: simulator.k])
    window = FORCED_SWAP_WINDOW_BYTES if swap is not None else 0
    best = simulator.run(PlanChoice(flags, window, window))
    return MixedResult(best, step, best.peak_bytes, "forced")
