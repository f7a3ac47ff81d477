"""How the ranks of a distributed run agree on planning; one process agrees with itself."""

from __future__ import annotations

from lightning_accudnn.profile import StepProfile


class RankCoordinator:
    """How ranks agree on planning; a single process agrees with itself.

    Example:
        >>> RankCoordinator().any(True), RankCoordinator().max(3.0)
        (True, 3.0)
    """

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on some rank."""
        return flag

    def max(self, value: float) -> float:
        """The largest ``value`` over the ranks."""
        return value

    def merge(self, profile: StepProfile) -> StepProfile:
        """One profile every rank plans from."""
        return profile
