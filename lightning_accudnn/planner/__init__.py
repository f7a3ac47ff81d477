"""The performance model: profiles in, swap plans out. Imports torch only, never ``ops``."""

from lightning_accudnn.planner.budget import ACCEPTED_FORMS, Budget, format_bytes
from lightning_accudnn.planner.plan import BudgetTooSmallError, Plan, lower_bound_seconds, plan_swaps
from lightning_accudnn.planner.timeline import LayerTiming, Timeline, prefetch_window_candidates, simulate
from lightning_accudnn.profile import LayerProfile, StepProfile

__all__ = [
    "ACCEPTED_FORMS",
    "Budget",
    "BudgetTooSmallError",
    "LayerProfile",
    "LayerTiming",
    "Plan",
    "StepProfile",
    "Timeline",
    "format_bytes",
    "lower_bound_seconds",
    "plan_swaps",
    "prefetch_window_candidates",
    "simulate",
]
