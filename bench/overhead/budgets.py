"""Budgets chosen from the planner's own report on a profile the strategy measured.

Example:
    >>> from lightning_accudnn.profile import LayerProfile, StepProfile
    >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1e-3, 2e-3) for i in range(8))
    >>> choice = budget_swapping_half(StepProfile(layers, static_bytes=1000))
    >>> 0.4 <= choice["planned_swapped_fraction"] <= 0.6
    True
"""

from __future__ import annotations

from typing import Any

from lightning_accudnn.planner import plan_swaps
from lightning_accudnn.profile import StepProfile


def _planned_fraction(profile: StepProfile, budget: int, reserve_bytes: int) -> float:
    plan = plan_swaps(profile, budget, reserve_bytes)
    return plan.swapped_bytes / profile.swappable_bytes


def budget_swapping_half(
    profile: StepProfile, tolerance: float = 0.05, max_plans: int = 12, reserve_bytes: int = 0
) -> dict[str, Any]:
    """A budget at which the planner swaps about half of ``profile``'s swappable bytes.

    Bisects between the planner's smallest budget (everything swapped) and the profile's
    unconstrained peak (nothing swapped), planning as the strategy does (with the reserve it
    keeps under the budget: ``reserve_bytes``, none on the CPU; the copy-out limit the
    planner chooses), until the planned swapped share is within ``tolerance`` of one half.
    Returns the budget (the reserve included) and how it was found.
    """
    if profile.swappable_bytes <= 0:
        raise ValueError("the profile has nothing swappable: no budget swaps half of it")
    high = profile.unconstrained_peak_bytes + reserve_bytes  # swaps nothing
    low = plan_swaps(profile, high, reserve_bytes).min_budget_bytes  # swaps the most
    budget, fraction, plans = high, 0.0, 0
    while plans < max_plans:
        budget = (low + high) // 2
        fraction = _planned_fraction(profile, budget, reserve_bytes)
        plans += 1
        if abs(fraction - 0.5) <= tolerance:
            break
        if fraction > 0.5:
            low = budget
        else:
            high = budget
    return {
        "budget_bytes": budget,
        "planned_swapped_fraction": fraction,
        "plans_tried": plans,
        "reserve_bytes": reserve_bytes,
        "how": (
            "bisection between the planner's smallest budget (plan_swaps(...).min_budget_bytes) and the "
            "profile's unconstrained peak, on the profile the strategy measured in a calibration fit, "
            f"planned as the strategy plans (its reserve: {reserve_bytes} B; the copy-out limit the "
            f"planner chooses), until the plan swaps {0.5 - tolerance:.0%}-{0.5 + tolerance:.0%} of the "
            "swappable bytes"
        ),
    }
