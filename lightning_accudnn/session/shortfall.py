"""What the allocator held above the peaks plans predicted, added to the next predictions."""

from __future__ import annotations

from lightning_accudnn.planner import Plan

__all__ = ["PredictionShortfall"]


class PredictionShortfall:
    """The bytes added to a plan's predicted peak in a pass's stats, so that a prediction is not
    below what earlier passes showed.

    Where working memory is measured (``measured``), plans count what the step holds beyond the
    ledger at each level: a plan whose passes held more than it predicted has the most of that
    added to its later predictions, and a new plan (made from what those passes measured)
    starts from none. Where it is not, plans count the ledger only: the most any pass held above
    its plan's prediction (a profiling pass: above the ledger) is added to every later one.

    Example:
        >>> from lightning_accudnn.planner import plan_swaps
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> plan = plan_swaps(StepProfile((LayerProfile("fc", 100, 100),), 0), 1_000)
        >>> shortfall = PredictionShortfall(measured=True)
        >>> shortfall.note(plan, ledger_peak_bytes=100, allocated_peak_bytes=130)
        >>> shortfall.for_plan(plan), shortfall.for_plan(None)
        (30, 0)
        >>> other = plan_swaps(StepProfile((LayerProfile("fc", 100, 100),), 0), 2_000)
        >>> shortfall.for_plan(other)  # a new plan, made from what the passes measured
        0
    """

    def __init__(self, measured: bool) -> None:
        self.measured = measured
        self._bytes = 0
        self._plan: Plan | None = None  # the plan the bytes are of, where measured

    def for_plan(self, plan: Plan | None) -> int:
        """What to add to ``plan``'s predicted peak (0 without a plan)."""
        if plan is None:
            return 0
        if self.measured and plan is not self._plan:
            return 0
        return self._bytes

    def note(self, plan: Plan | None, *, ledger_peak_bytes: int, allocated_peak_bytes: int) -> None:
        """A pass under ``plan`` (``None``: a profiling pass) peaked at ``allocated_peak_bytes``
        and its ledger at ``ledger_peak_bytes``."""
        if self.measured:
            if plan is not None:
                self._bytes = max(self.for_plan(plan), allocated_peak_bytes - plan.predicted_peak_bytes)
                self._plan = plan
            return
        predicted = ledger_peak_bytes if plan is None else plan.predicted_peak_bytes
        self._bytes = max(self._bytes, allocated_peak_bytes - predicted)
