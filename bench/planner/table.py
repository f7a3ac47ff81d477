"""Plan one traced model under every policy at budgets of static bytes plus a share of its activations.

A budget is ``static bytes + f x saved activation bytes``, both as the trace reports them,
for each ``f`` of :data:`FRACTIONS`. Each policy is planned through the planner's public API,
so the table follows the planner as it improves:

* ``auto``, ``swap``, ``recompute``, ``selective``:
  :func:`~lightning_accudnn.planner.plan.plan_swaps` with that ``policy``;
* ``checkpoint blocks``: every top-level block recomputed, the rest kept
  (:func:`~lightning_accudnn.planner.blocks.checkpoint_blocks_plan`), what
  ``torch.utils.checkpoint`` around each block gives.

Each row has the predicted step (and as a multiple of the unconstrained step), the predicted
peak, and the lower bound the planner reports for that budget and policy
(``Plan.lower_bound_seconds``, or :func:`~lightning_accudnn.planner.plan.lower_bound_seconds`
where no plan fits).

Example:
    >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
    >>> layers = tuple(LayerProfile(f"h.{i}.fc", 10**6, 10**6, 1e-3, 2e-3) for i in range(4))
    >>> segments = tuple(SegmentProfile(f"h.{i}", 10**5, 10**5) for i in range(4))
    >>> profile = StepProfile(layers, 10**7, 5e10, 5e10, segments=segments)
    >>> row = plan_row(profile, "1/2", 0.5, "checkpoint blocks")
    >>> row["status"], row["budget_bytes"], round(row["step_vs_unconstrained"], 2)
    ('planned', 12000000, 1.33)
"""

from __future__ import annotations

import time
from typing import Any

from lightning_accudnn.planner.blocks import checkpoint_blocks_plan
from lightning_accudnn.planner.plan import BudgetTooSmallError, Plan, lower_bound_seconds, plan_swaps
from lightning_accudnn.planner.search import POLICIES
from lightning_accudnn.planner.timeline import unconstrained_seconds
from lightning_accudnn.profile import StepProfile

__all__ = ["CHECKPOINT_BLOCKS", "FRACTIONS", "NOT_AVAILABLE", "TABLE_POLICIES", "plan_row"]

#: Budget fractions of the saved activation bytes, as labelled in the table.
FRACTIONS = (("2/3", 2 / 3), ("1/2", 1 / 2), ("1/3", 1 / 3), ("1/4", 1 / 4))
CHECKPOINT_BLOCKS = "checkpoint blocks"
#: The table's columns: planner policies, then full per-block checkpointing.
TABLE_POLICIES = ("auto", "swap", "recompute", "selective", CHECKPOINT_BLOCKS)
POLICY_TITLES = {
    "auto": "auto",
    "swap": "swap only",
    "recompute": "recompute only",
    "selective": "selective only",
    CHECKPOINT_BLOCKS: "full per-block checkpointing",
}
NOT_AVAILABLE = "not available"
PLANNED, DOES_NOT_FIT = "planned", "does not fit"


def budget_for(profile: StepProfile, fraction: float) -> int:
    """``static bytes + fraction x saved bytes``, rounded to a byte."""
    return profile.static_bytes + round(fraction * profile.saved_bytes)


def _plan(profile: StepProfile, budget: int, policy: str) -> Plan:
    if policy == CHECKPOINT_BLOCKS:
        return checkpoint_blocks_plan(profile, budget)
    return plan_swaps(profile, budget, policy=policy)


def plan_row(profile: StepProfile, label: str, fraction: float, policy: str) -> dict[str, Any]:
    """One cell of the table: ``policy`` planned at ``budget_for(profile, fraction)``."""
    budget = budget_for(profile, fraction)
    unconstrained = unconstrained_seconds(profile)
    row: dict[str, Any] = {
        "fraction": label,
        "policy": policy,
        "budget_bytes": budget,
        "unconstrained_step_seconds": unconstrained,
    }
    if policy != CHECKPOINT_BLOCKS and policy not in POLICIES:
        return {**row, "status": NOT_AVAILABLE, "reason": f"the planner offers no policy {policy!r}"}
    bound_policy = "recompute" if policy == CHECKPOINT_BLOCKS else policy
    started = time.perf_counter()
    try:
        plan = _plan(profile, budget, policy)
    except BudgetTooSmallError as error:
        bound = lower_bound_seconds(profile, budget, bound_policy)
        return {
            **row,
            "status": DOES_NOT_FIT,
            "min_budget_bytes": error.min_budget_bytes,
            "lower_bound_seconds": bound,
            "lower_bound_vs_unconstrained": bound / unconstrained,
            "plan_seconds": time.perf_counter() - started,
        }
    return {
        **row,
        "status": PLANNED,
        "predicted_step_seconds": plan.predicted_step_seconds,
        "step_vs_unconstrained": plan.predicted_step_seconds / unconstrained,
        "predicted_peak_bytes": plan.predicted_peak_bytes,
        "peak_share_of_budget": plan.predicted_peak_bytes / budget,
        "lower_bound_seconds": plan.lower_bound_seconds,
        "lower_bound_vs_unconstrained": plan.lower_bound_seconds / unconstrained,
        "bound_ratio": plan.bound_ratio,
        "recomputed_segments": len(plan.recomputed),
        "selective_segments": len(plan.selective),
        "swapped_bytes": plan.swapped_bytes,
        "recompute_seconds": plan.recompute_seconds,
        "search": plan.search,
        "plan_seconds": time.perf_counter() - started,
    }
