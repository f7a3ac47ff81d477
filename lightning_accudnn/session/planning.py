"""The session's planner: one headroom, the planner called under it, the reserve grown when it must.

:class:`SessionPlanning` holds the :class:`~lightning_accudnn.planner.headroom.Headroom` every
plan of the session is made under (the budget the allocator is capped at, the reserve kept
free under it), the floor the profiling passes set (no plan's budget below their peak) and the
segments whose recomputation failed; :meth:`SessionPlanning.make_plan` is the one call to the
planner, and :meth:`SessionPlanning.raise_reserve` the one place the reserve grows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from lightning_accudnn.ops import HostMemoryExceeded, OffloadEngine
from lightning_accudnn.ops.layers import SaveSequence
from lightning_accudnn.planner import BudgetTooSmallError, Plan, StepProfile, format_bytes, named_for_reserve
from lightning_accudnn.planner.headroom import Headroom
from lightning_accudnn.planner.plan import HostLimitTooSmallError, plan_swaps
from lightning_accudnn.session.config import smallest_budget_bytes
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.recompute_failures import RecomputeFailures
from lightning_accudnn.session.shapes import same_pass_other_shape
from lightning_accudnn.session.transfers import layer_host_bytes

__all__ = ["SessionPlanning"]

log = logging.getLogger("lightning_accudnn")


class SessionPlanning:
    """Plans for the passes of one session, all under one headroom.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> import torch
        >>> engine = OffloadEngine(torch.device("cpu"), host_memory_limit=10**6)
        >>> planning = SessionPlanning(Headroom(10_000, 1_000), engine,
        ...                            policy="swap", min_swap_bytes=0, report=lambda line: None)
        >>> key = PassKey(model=1, batch=(), position=0)
        >>> profile = StepProfile(tuple(LayerProfile(f"l{i}", 4_000, 4_000, 1e-3, 2e-3) for i in range(3)),
        ...                       static_bytes=1_000, d2h_bytes_per_second=1e9, h2d_bytes_per_second=1e9)
        >>> plan = planning.make_plan(profile, key)
        >>> plan.predicted_peak_bytes <= planning.headroom.usable_bytes == 9_000
        True
    """

    def __init__(
        self,
        headroom: Headroom,
        engine: OffloadEngine,
        *,
        policy: str,
        min_swap_bytes: int,
        report: Callable[[str], None],
        reserve_rule: str | None = None,
    ) -> None:
        self.headroom = headroom
        # The device type whose default reserve the budget keeps (OffloadConfig.reserve_bytes left
        # to None: it grows with the budget), and what was raised on top of it since.
        self.reserve_rule = reserve_rule
        self._raised_reserve = 0
        self.engine = engine  # its host pool: what swapped activations may pin
        self.policy = policy
        self.min_swap_bytes = min_swap_bytes
        self.report = report
        self.recompute_failures = RecomputeFailures()  # segments whose recomputation failed in backward
        # Per pass that profiled: its profiling pass's ledger peak less its model state (no plan's
        # budget may be below that pass's peak: it runs first, in every run).
        self._profiling_activation_peaks: dict[PassKey, int] = {}

    def raise_reserve(self, nbytes: int, why: str) -> None:
        """Grow the reserve by ``nbytes`` (logged as a warning saying ``why``)."""
        self.headroom = self.headroom.raised(nbytes)
        self._raised_reserve += nbytes
        log.warning(
            "accudnn: %s; reserve raised by %s to %s (%s usable), re-planned",
            why,
            format_bytes(nbytes),
            format_bytes(self.headroom.reserve_bytes),
            format_bytes(self.headroom.usable_bytes),
        )

    def exclude_segment(self, model: int, segment: str, reason: str) -> bool:
        """Keep ``segment`` of ``model`` out of its plans from now on (logged as a warning);
        ``False`` when it already was (the plans recomputing it need no re-making)."""
        if not self.recompute_failures.exclude(model, segment, reason):
            return False
        log.warning(
            "accudnn: recomputing segment %r failed in backward (%s); the step was aborted, the segment "
            "is no longer recomputed and the step is re-planned",
            segment,
            reason,
        )
        return True

    def note_profiling_peak(self, key: PassKey, activation_peak_bytes: int) -> None:
        """``key``'s profiling pass peaked at ``activation_peak_bytes`` over its model state."""
        self._profiling_activation_peaks[key] = activation_peak_bytes

    def make_plan(
        self,
        profile: StepProfile,
        key: PassKey,
        sequence: SaveSequence | None = None,
        route: str | None = None,
    ) -> Plan:
        """The fastest plan under the headroom. The planner's smallest budget does not depend on
        the budget asked or on the timings, so a budget an error named always plans.

        No plan's budget is below the peak of the profiling passes this pass ran in this run
        (at this batch shape or another; the first runs first in every run): their largest
        measured activation peak over ``profile``'s model state, whatever pass ``profile`` came
        from (profiling, refining, merged across ranks, scaled from another shape). A shape
        planned from another's profile never profiles, so its own computed peak of swapping
        everything is not its floor: a scaled plan may recompute below it. With no profiling
        pass known, the planner computes the floor. ``sequence`` is the pass's recorded save
        sequence (its host buffers' sizes), ``route`` how the plan applies (``Plan.route``)."""
        plan = self.plan_job(profile, key, sequence, route)()
        self.report_plan(plan, key)
        return plan

    def plan_job(
        self,
        profile: StepProfile,
        key: PassKey,
        sequence: SaveSequence | None = None,
        route: str | None = None,
    ) -> Callable[[], Plan]:
        """:meth:`make_plan`'s planning as a call that reads nothing of the session's when it
        runs (the headroom, the host pool, the failed segments and the profiling floor are read
        now), so that it may run on another thread."""
        budget = self.headroom.budget_bytes
        reserve = self.headroom.reserve_bytes
        policy = self.policy
        profile = self.recompute_failures.applied(key.model, profile)
        pool = self.engine.pool
        capacity = pool.capacity_bytes
        host_bytes = layer_host_bytes(profile, sequence, self.min_swap_bytes, pool.host_bytes)
        profiling_peak = self._profiling_peak(key, profile.static_bytes)
        budget_for = self.budget_for()

        def make() -> Plan:
            try:
                plan = plan_swaps(
                    profile,
                    budget,
                    reserve,
                    policy=policy,
                    host_limit_bytes=capacity,
                    host_bytes=host_bytes,
                    profiling_peak_bytes=profiling_peak,
                )
            except HostLimitTooSmallError as error:
                nothing_swapped = budget_for(error.nothing_swapped_budget_bytes - reserve)
                named_error = HostLimitTooSmallError(
                    error.host_limit_bytes, error.host_bytes_needed, error.budget_bytes, nothing_swapped
                )
                raise HostMemoryExceeded(str(named_error)) from named_error
            except BudgetTooSmallError as refusal:
                named_refusal = named_for_reserve(refusal, budget_for)
                # The error raised holds this frame in its traceback, and the frame its callers'
                # (the forward's tensors, where a pass plans): a local holding an error would make
                # a cycle that keeps them alive until the cyclic collector runs, though the caller
                # caught and dropped the error.
                try:
                    enough = named_refusal.with_host_memory_for_all_bytes
                    if enough is None or budget < enough:
                        if named_refusal is refusal:
                            raise
                        raise named_refusal from None  # the same refusal, its budgets named for the reserve
                    message = host_limit_message(capacity, host_bytes, named_refusal, budget)
                    raise HostMemoryExceeded(message) from named_refusal
                finally:
                    del named_refusal
            return plan if route is None else replace(plan, route=route)

        return make

    def budget_for(self) -> Callable[[int], int]:
        """The smallest budget whose part left to plans holds a number of bytes, as errors name
        it: with the default reserve, which grows with the budget, less that reserve and any
        raised on top of it; with a reserve given, less that reserve.

        Example:
            >>> import torch
            >>> from lightning_accudnn.session.config import default_reserve_bytes
            >>> engine = OffloadEngine(torch.device("cpu"))
            >>> planning = SessionPlanning(Headroom(10**9, 2**28), engine, policy="swap", min_swap_bytes=0,
            ...                            report=lambda line: None, reserve_rule="cuda")
            >>> budget = planning.budget_for()(9 * 10**9)
            >>> budget - default_reserve_bytes(budget, "cuda") >= 9 * 10**9
            True
        """
        rule, raised, reserve = self.reserve_rule, self._raised_reserve, self.headroom.reserve_bytes
        if rule is None:
            return lambda usable: usable + reserve
        return lambda usable: smallest_budget_bytes(usable + raised, rule)

    def report_plan(self, plan: Plan, key: PassKey) -> None:
        """Report ``plan``, made for ``key``, in one line."""
        profile = plan.profile
        which = f" (pass {key.position + 1} of the step)" if key.position else ""
        self.report(
            f"accudnn plan{which}: swap {plan.swapped_count_text} "
            f"({format_bytes(plan.swapped_bytes)} of {format_bytes(profile.saved_bytes)} saved), "
            f"recompute {len(plan.recomputed)} segments, "
            f"predicted peak {format_bytes(plan.predicted_peak_bytes)} of budget "
            f"{format_bytes(plan.budget_bytes)}, "
            f"step {plan.predicted_step_seconds * 1e3:.1f} ms, bound ratio {plan.bound_ratio:.2f}"
        )

    def _profiling_peak(self, key: PassKey, static_bytes: int) -> int | None:
        """The largest measured peak of the profiling passes of ``key``'s pass (any batch shape),
        with ``static_bytes`` of model state; ``None`` when none profiled on this rank."""
        peaks = [
            peak
            for other, peak in self._profiling_activation_peaks.items()
            if other == key or same_pass_other_shape(other, key)
        ]
        return static_bytes + max(peaks) if peaks else None


def host_limit_message(
    capacity_bytes: int, host_bytes: Sequence[int], error: BudgetTooSmallError, budget_bytes: int
) -> str:
    """Why a budget that would do but for the host limit fails: the profiling pass kept on the
    device what the host pool could not take.

    Example:
        >>> error = BudgetTooSmallError(2_000, 1_500, 0, with_host_memory_for_all_bytes=1_200)
        >>> print(host_limit_message(100, [300, 300], error, 1_500).split(". ")[-1])
        Raise host_memory_limit by at least 500 B (to 600 B, every activation), or raise the budget to \
at least 2.00 KB.
    """
    needed = sum(host_bytes)
    return (
        f"the host-memory limit of {format_bytes(capacity_bytes)} is too small for this "
        f"training step: the profiling pass (the first pass of a new batch shape swaps every "
        f"activation) kept on the device what it could not hold and needed "
        f"{format_bytes(error.min_budget_bytes)} of device memory, over the budget of "
        f"{format_bytes(budget_bytes)}. Raise host_memory_limit by at least "
        f"{format_bytes(max(1, needed - capacity_bytes))} (to {format_bytes(needed)}, "
        f"every activation), or raise the budget to at least {format_bytes(error.min_budget_bytes)}."
    )
