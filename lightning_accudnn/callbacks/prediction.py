"""Predict which batch sizes fit a memory budget, and how fast, from one measured profile.

Saved activations and layer compute times scale linearly with the batch size (the planner's
:func:`~lightning_accudnn.planner.scale_profile` with a batch ratio); the static memory
(parameters, gradients, optimizer state) does not. The rest of a training batch (optimizer
step, data loading, launch overhead) is taken as a constant: the measured time per batch
less the planned compute time. For each candidate the swap planner then says whether any
plan fits the budget and what its step would cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lightning_accudnn.callbacks.batch_search import Prediction
from lightning_accudnn.planner import (
    BudgetTooSmallError,
    StepProfile,
    format_bytes,
    named_for_reserve,
    plan_swaps,
    scale_profile,
)

__all__ = ["largest_feasible_batch_size", "predict_batch_sizes"]


def predict_batch_sizes(
    profile: StepProfile,
    measured_batch_size: int,
    measured_seconds_per_batch: float | None,
    sizes: Sequence[int],
    budget_bytes: int,
    reserve_bytes: int = 0,
    *,
    add_largest: bool = False,
    policy: str = "auto",
    budget_for: Callable[[int], int] | None = None,
) -> dict[int, Prediction]:
    """Feasibility, predicted time per batch and predicted peak for each of ``sizes``.

    ``profile`` was measured at ``measured_batch_size``, where one training batch took
    ``measured_seconds_per_batch`` in all (``None``: no overhead is added). With
    ``add_largest``, when some of ``sizes`` fit and a larger one does not, the largest size
    in between that fits (see :func:`largest_feasible_batch_size`) is predicted too. A size
    that does not fit names the budget it needs: ``budget_for`` the bytes its plans need
    (the session's :meth:`~lightning_accudnn.session.OffloadSession.smallest_budget_bytes`,
    whose default reserve grows with the budget); without it, those bytes and
    ``reserve_bytes``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1e-3, 2e-3) for i in range(3))
        >>> profile = StepProfile(layers, static_bytes=1_000)
        >>> predictions = predict_batch_sizes(profile, 8, 0.010, [8, 16, 64], budget_bytes=1_500)
        >>> [(b, p.feasible) for b, p in predictions.items()]
        [(8, True), (16, True), (64, False)]
        >>> round(predictions[16].seconds_per_batch, 6)  # 1 ms overhead + twice 9 ms of compute
        0.019
    """
    overhead = 0.0
    if measured_seconds_per_batch is not None:
        try:
            base = plan_swaps(profile, budget_bytes, reserve_bytes, policy=policy)
            overhead = max(0.0, measured_seconds_per_batch - base.predicted_step_seconds)
        except BudgetTooSmallError:
            overhead = 0.0
    predictions: dict[int, Prediction] = {}
    for size in sizes:
        scaled = scale_profile(profile, size / measured_batch_size)
        try:
            plan = plan_swaps(scaled, budget_bytes, reserve_bytes, policy=policy)
        except BudgetTooSmallError as error:
            named = error if budget_for is None else named_for_reserve(error, budget_for)
            predictions[size] = Prediction(
                size,
                feasible=False,
                peak_bytes=error.min_budget_bytes - reserve_bytes,
                reason=f"needs a budget of {format_bytes(named.min_budget_bytes)}, "
                f"has {format_bytes(budget_bytes)}",
            )
            continue
        predictions[size] = Prediction(
            size,
            feasible=True,
            seconds_per_batch=overhead + plan.predicted_step_seconds,
            peak_bytes=plan.predicted_peak_bytes,
        )
    fitting = [size for size, p in predictions.items() if p.feasible]
    if add_largest and fitting:
        low = max(fitting)
        above = [size for size, p in predictions.items() if not p.feasible and size > low]
        if above:
            largest = largest_feasible_batch_size(
                profile, measured_batch_size, low, min(above), budget_bytes, reserve_bytes, policy
            )
            if largest not in predictions:
                predictions.update(
                    predict_batch_sizes(
                        profile,
                        measured_batch_size,
                        measured_seconds_per_batch,
                        [largest],
                        budget_bytes,
                        reserve_bytes,
                        policy=policy,
                        budget_for=budget_for,
                    )
                )
    return dict(sorted(predictions.items()))


def largest_feasible_batch_size(
    profile: StepProfile,
    measured_batch_size: int,
    low: int,
    high: int,
    budget_bytes: int,
    reserve_bytes: int = 0,
    policy: str = "auto",
) -> int:
    """The largest batch size in ``[low, high)`` some swap plan fits, by bisection.

    ``low`` must fit and ``high`` must not. Sizes from 8 up are kept to multiples of 8 (what
    GPU kernels like), smaller ones to integers.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 0) for i in range(3))  # nothing swappable
        >>> profile = StepProfile(layers, static_bytes=1_000)  # 300 activation bytes at batch 8
        >>> largest_feasible_batch_size(profile, 8, low=8, high=64, budget_bytes=2_000)
        24
    """
    multiple = 8 if low >= 8 else 1

    def fits(size: int) -> bool:
        scaled = scale_profile(profile, size / measured_batch_size)
        try:
            plan_swaps(scaled, budget_bytes, reserve_bytes, policy=policy)
        except BudgetTooSmallError:
            return False
        return True

    while high - low > multiple:
        middle = (low + high) // 2 // multiple * multiple
        if middle <= low:
            break
        if fits(middle):
            low = middle
        else:
            high = middle
    return low
