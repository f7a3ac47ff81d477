"""Why a plan is refused: the budget is too small, the host limit too small, or a policy that
recomputes finds nothing to recompute. Each error says what to change.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lightning_accudnn.planner.budget import format_bytes
from lightning_accudnn.planner.search import KEEP_OR_RECOMPUTE
from lightning_accudnn.profile import StepProfile

__all__ = [
    "BudgetTooSmallError",
    "HostLimitTooSmallError",
    "NothingToRecomputeError",
    "named_for_reserve",
    "refuse_recompute_without_segments",
]


class BudgetTooSmallError(ValueError):
    """No plan fits the budget. ``min_budget_bytes`` is the smallest budget (reserve included)
    at which :func:`plan_swaps` succeeds for this profile: the larger of the least peak of any
    plan and the peak of the session's profiling pass (every activation swapped, nothing
    recomputed), plus the reserve; the same whatever budget was asked and whatever the timings.
    ``profiling_binds`` is true when the profiling pass is what sets it (plans that recompute
    would need less, but that pass runs first). When that pass's measured peak passed the
    computed one (the host-memory limit kept storages on the device),
    ``with_host_memory_for_all_bytes`` is the smallest budget with host memory for everything.

    When saved tensors below ``min_swap_bytes`` stay on the device and a smaller threshold
    would lower the smallest budget by at least 1%, ``smaller_min_swap_bytes`` is
    ``(threshold, smallest budget with it)`` (``None`` otherwise, or when the profile does not
    list them).

    Example:
        >>> from lightning_accudnn.planner.plan import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 100, 0),), static_bytes=1_000)
        >>> try:
        ...     plan_swaps(profile, budget_bytes=1_000)
        ... except BudgetTooSmallError as error:
        ...     error.min_budget_bytes
        1100
    """

    def __init__(
        self,
        min_budget_bytes: int,
        budget_bytes: int,
        reserve_bytes: int,
        smaller_min_swap_bytes: tuple[int, int] | None = None,
        *,
        profiling_binds: bool = False,
        with_host_memory_for_all_bytes: int | None = None,
    ) -> None:
        self.min_budget_bytes = min_budget_bytes
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        self.smaller_min_swap_bytes = smaller_min_swap_bytes
        self.profiling_binds = profiling_binds
        self.with_host_memory_for_all_bytes = with_host_memory_for_all_bytes
        needed = _rounded_up(min_budget_bytes)  # rounded up: that much is enough
        reserve = f" (including the {format_bytes(reserve_bytes)} reserve)" if reserve_bytes else ""
        who = (
            "the first pass of a new batch shape (the profiling pass) swaps every activation and "
            f"recomputes none, and needs {needed} ({min_budget_bytes} bytes){reserve}; the plans made "
            "after it need less, but that pass runs first"
            if profiling_binds
            else f"even the least memory-hungry plan needs {needed} ({min_budget_bytes} bytes){reserve}"
        )
        message = (
            f"memory budget {format_bytes(budget_bytes)} is too small for this training step: {who}. "
            f"Raise the budget to at least {needed}, or lower the batch size so that the "
            "activations shrink."
        )
        if with_host_memory_for_all_bytes is not None:
            message += (
                " The profiling pass measured more than swapping every activation holds: what the "
                "host-memory limit could not take stayed on the device. With host memory for all of it "
                f"the smallest budget would be {_rounded_up(with_host_memory_for_all_bytes)}: raise "
                "host_memory_limit, or the budget."
            )
        if smaller_min_swap_bytes is not None:
            threshold, smaller = smaller_min_swap_bytes
            message += (
                f" The smallest budget is limited by min_swap_bytes: saved tensors below it stay on "
                f"the device; with min_swap_bytes={threshold} the smallest budget would be "
                f"{_rounded_up(smaller)} ({format_bytes(min_budget_bytes - smaller)} less)."
            )
        super().__init__(message)


def named_for_reserve(error: BudgetTooSmallError, budget_for: Callable[[int], int]) -> BudgetTooSmallError:
    """``error`` with every budget it names made by ``budget_for`` from the bytes a plan may use
    under it (the budget less the reserve): for a reserve that grows with the budget, a budget
    named from a fixed reserve would be refused again.

    Example:
        >>> error = BudgetTooSmallError(1_100, 1_000, 100)  # 1,000 usable and a reserve of 100
        >>> named = named_for_reserve(error, lambda usable: usable + usable // 5)  # a fifth of it
        >>> named.min_budget_bytes, named.reserve_bytes
        (1200, 200)
        >>> named_for_reserve(error, lambda usable: usable + 100) is error
        True
    """
    usable = error.min_budget_bytes - error.reserve_bytes
    named = budget_for(usable)
    if named == error.min_budget_bytes:  # the reserve the planner was given is the named budget's
        return error
    smaller = error.smaller_min_swap_bytes
    host = error.with_host_memory_for_all_bytes
    return BudgetTooSmallError(
        named,
        error.budget_bytes,
        named - usable,
        None if smaller is None else (smaller[0], budget_for(smaller[1] - error.reserve_bytes)),
        profiling_binds=error.profiling_binds,
        with_host_memory_for_all_bytes=None if host is None else budget_for(host - error.reserve_bytes),
    )


class HostLimitTooSmallError(ValueError):
    """Plans fit the device budget, but none within the host-memory limit as well.

    ``host_bytes_needed`` is what a plan within the device budget that swaps few bytes puts
    in host memory (rounded as the host pool rounds); ``nothing_swapped_budget_bytes`` the
    device budget at which nothing is swapped.

    Example:
        >>> from lightning_accudnn.planner.plan import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = (LayerProfile("a", 400, 400), *(LayerProfile(name, 100, 100) for name in "bcd"))
        >>> try:
        ...     plan_swaps(StepProfile(layers, static_bytes=1_000), budget_bytes=1_600, host_limit_bytes=250)
        ... except HostLimitTooSmallError as error:
        ...     error.host_bytes_needed, error.nothing_swapped_budget_bytes
        (300, 1700)
    """

    def __init__(
        self,
        host_limit_bytes: int,
        host_bytes_needed: int,
        budget_bytes: int,
        nothing_swapped_budget_bytes: int,
    ) -> None:
        self.host_limit_bytes = host_limit_bytes
        self.host_bytes_needed = host_bytes_needed
        self.budget_bytes = budget_bytes
        self.nothing_swapped_budget_bytes = nothing_swapped_budget_bytes
        short = host_bytes_needed - host_limit_bytes
        super().__init__(
            f"no plan fits both the device budget of {format_bytes(budget_bytes)} and the host-memory "
            f"limit of {format_bytes(host_limit_bytes)}: a plan within the device budget swaps "
            f"{format_bytes(host_bytes_needed)} to host memory. Raise host_memory_limit by at least "
            f"{format_bytes(short)} (to {format_bytes(host_bytes_needed)}, system RAM permitting), or "
            "raise the device budget so that less is swapped (at "
            f"{_rounded_up(nothing_swapped_budget_bytes)} nothing is), or lower the batch size."
        )


def _rounded_up(nbytes: int) -> str:
    """``nbytes`` in the unit :func:`format_bytes` picks, rounded up to two decimals."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if nbytes >= size:
            return f"{math.ceil(nbytes * 100 / size) / 100:.2f}{unit}"
    return f"{nbytes}B"


class NothingToRecomputeError(ValueError):
    """``policy="recompute"`` on a step with no segment that can be recomputed exactly.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> try:
        ...     refuse_recompute_without_segments(StepProfile((LayerProfile("a", 1, 1),), 0), "recompute")
        ... except ValueError as error:  # a NothingToRecomputeError: the message names the cause
        ...     type(error).__name__
        'NothingToRecomputeError'
    """


def refuse_recompute_without_segments(profile: StepProfile, policy: str) -> None:
    """Raise :class:`NothingToRecomputeError` when ``policy`` is ``"recompute"`` (or
    ``"selective"``) and ``profile`` found no segment to recompute (selectively: whose selective
    recomputation was measured); the message names why each candidate was excluded.

    Example:
        >>> from lightning_accudnn.profile import ExcludedSegment, LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 1, 1),), 0,
        ...                       excluded_segments=(ExcludedSegment("a", "calling it changes a.calls"),))
        >>> refuse_recompute_without_segments(profile, "auto")
        >>> refuse_recompute_without_segments(profile, "recompute")
        Traceback (most recent call last):
        ...
        lightning_accudnn.planner.refusals.NothingToRecomputeError: policy='recompute' needs a segment ...
    """
    if policy not in KEEP_OR_RECOMPUTE:
        return
    if policy == "selective":
        if any(segment.selective_kept_bytes is not None for segment in profile.segments):
            return
        if profile.segments:
            reasons = "; ".join(
                f"{excluded.name}: {excluded.reason}" for excluded in profile.excluded_segments
            )
            raise NothingToRecomputeError(
                "policy='selective' needs a segment whose selective recomputation was measured, and "
                "this profile measured none (a profiling pass run for policy 'selective' measures it; "
                "a model with compiled blocks is not measured"
                + (f"; excluded: {reasons}" if reasons else "")
                + "). Use policy='recompute' or policy='auto'."
            )
    elif profile.segments:
        return
    reasons = "; ".join(f"{excluded.name}: {excluded.reason}" for excluded in profile.excluded_segments)
    found = (
        f"every candidate would not be replayed exactly ({reasons})"
        if reasons
        else "no module is called once per step with submodules under the engine's hooks"
    )
    raise NothingToRecomputeError(
        f"policy={policy!r} needs a segment that can be recomputed exactly, and this model has none: "
        f"{found}. Use policy='auto' or policy='swap'."
    )
