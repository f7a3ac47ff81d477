"""The performance model: profiles in, swap plans out.

Imports the standard library and the profile types (:mod:`lightning_accudnn.profile`) only:
never torch, never ``ops``. Profiles come from a live step (the session) or from
:mod:`lightning_accudnn.profiling` (the dry-run trace, the GPU table, the host-link probe).
"""

from lightning_accudnn.planner.budget import ACCEPTED_FORMS, Budget, format_bytes
from lightning_accudnn.planner.plan import (
    BudgetTooSmallError,
    Plan,
    lower_bound_seconds,
    min_budget_bytes,
    plan_swaps,
    swap_everything_peak_bytes,
)
from lightning_accudnn.planner.refusals import (
    HostLimitTooSmallError,
    NothingToRecomputeError,
    named_for_reserve,
)
from lightning_accudnn.planner.scaling import ShapeRatio, fit_growth, plan_covers, scale_profile, shape_ratio
from lightning_accudnn.planner.timeline import (
    LayerTiming,
    MemoryEstimate,
    PlanChoice,
    SimulationResult,
    Simulator,
    StepTimes,
    Timeline,
    limit_candidates,
    prefetch_window_candidates,
    simulate,
    unconstrained_seconds,
)
from lightning_accudnn.profile import LayerProfile, StepProfile

__all__ = [
    "ACCEPTED_FORMS",
    "Budget",
    "BudgetTooSmallError",
    "HostLimitTooSmallError",
    "LayerProfile",
    "LayerTiming",
    "MemoryEstimate",
    "NothingToRecomputeError",
    "Plan",
    "ShapeRatio",
    "PlanChoice",
    "SimulationResult",
    "Simulator",
    "StepProfile",
    "StepTimes",
    "Timeline",
    "fit_growth",
    "format_bytes",
    "limit_candidates",
    "lower_bound_seconds",
    "min_budget_bytes",
    "named_for_reserve",
    "plan_covers",
    "plan_swaps",
    "prefetch_window_candidates",
    "scale_profile",
    "shape_ratio",
    "simulate",
    "swap_everything_peak_bytes",
    "unconstrained_seconds",
]
