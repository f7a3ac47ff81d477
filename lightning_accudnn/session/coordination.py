"""How the ranks of a distributed run agree on planning; one process agrees with itself.

Ranks agree at **agreement points** only, never on every pass: every ``N``-th pass (the
coordinator's schedule, the same pass on every rank, since every rank runs as many passes).
Nothing else can be one: ranks fed batches of other shapes profile and refine at other
passes. In between, a rank plans a profiling or refining pass from its own figures, and
what it notices (a pass to plan, a peak over the budget, a graph that changed) waits as a
:class:`ReplanRequest` keyed by the pass it concerns; the next agreement merges the
requests of every rank per key and plans those passes alike on every rank, at once (not on
a thread: see ``plan_in_background`` in :class:`~lightning_accudnn.session.OffloadConfig`), so
that every rank runs the new plans from the next pass.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from lightning_accudnn.profile import StepProfile

__all__ = ["RankCoordinator", "ReplanRequest"]


@dataclass(frozen=True)
class ReplanRequest:
    """What a rank asks for one pass kind: plan it again (from its latest profile), and grow
    the reserve by ``overshoot_bytes`` first. ``refine_only``: the re-plan only refines the
    plan in force from warmer timings (that plan still holds), so it may be made while training
    goes on; merged, a request is that only when every re-plan in it is and no reserve grows.

    Example:
        >>> ReplanRequest(overshoot_bytes=10) | ReplanRequest(replan=True, overshoot_bytes=4)
        ReplanRequest(replan=True, overshoot_bytes=10, refine_only=False)
        >>> ReplanRequest(replan=True, refine_only=True) | ReplanRequest()
        ReplanRequest(replan=True, overshoot_bytes=0, refine_only=True)
    """

    replan: bool = False
    overshoot_bytes: int = 0
    refine_only: bool = False

    def __or__(self, other: ReplanRequest) -> ReplanRequest:
        replan = self.replan or other.replan
        overshoot_bytes = max(self.overshoot_bytes, other.overshoot_bytes)
        refine_only = (
            replan
            and not overshoot_bytes
            and all(request.refine_only for request in (self, other) if request.replan)
        )
        return ReplanRequest(replan, overshoot_bytes, refine_only)

    def __bool__(self) -> bool:
        return self.replan or self.overshoot_bytes > 0


class RankCoordinator:
    """How ranks agree on planning; a single process agrees with itself, after every pass.

    Keys are the same on every rank (a pass kind as every rank names it). ``collectives``
    counts the collective operations run so far (none here).

    Example:
        >>> coordinator = RankCoordinator()
        >>> coordinator.due()
        True
        >>> coordinator.agree({"pass 0": ReplanRequest(overshoot_bytes=5), "pass 1": ReplanRequest()})
        {'pass 0': ReplanRequest(replan=False, overshoot_bytes=5, refine_only=False)}
    """

    collectives = 0

    @property
    def shared(self) -> bool:
        """Whether other ranks run the plans agreed here (they must then change at the same
        pass on every rank)."""
        return False

    def due(self) -> bool:
        """Called once per pass on every rank: whether the ranks agree after this pass."""
        return True

    def agree(self, requests: Mapping[Hashable, ReplanRequest]) -> dict[Hashable, ReplanRequest]:
        """Every rank's requests, merged per key (any re-plan, the largest overshoot); the
        same on every rank. Keys no rank asks anything of are left out."""
        return {key: request for key, request in requests.items() if request}

    def merge(self, profiles: Mapping[Hashable, StepProfile | None]) -> dict[Hashable, StepProfile]:
        """Per key, one profile every rank plans from (``None``: this rank has none to give)."""
        return {key: profile for key, profile in profiles.items() if profile is not None}
