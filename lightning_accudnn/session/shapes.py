"""A pass of a batch shape not seen before, planned from the passes of other shapes.

Dynamic padding gives every batch its own sequence length, multi-scale vision models their
own image sizes, and an epoch's last batch is short. A profiling step per shape (everything
swapped, the slowest step there is) would never end, so a pass whose :class:`~.plan_book.PassKey`
misses but which has the model, the position in the step and the batch structure (the same
number of tensors, ranks and dtypes) of passes already planned is planned from them:

1. **Reuse (``COVERED``).** Among the plans already made for other shapes of the pass from
   their own figures (profiled, scaled or refined, not themselves reused), the plan of the
   smallest shape that covers the new one
   (:func:`~lightning_accudnn.planner.plan_covers`: the new shape's profile, scaled
   conservatively from that plan's profile, has no higher predicted peak under it) is
   reused when the new shape has at least :data:`COVER_SHARE` of its elements. A plan made
   for length 64 thus runs lengths 32 to 63 and an image size's plan the smaller sizes down
   to half its pixels: the planner is not consulted for them. Smaller shapes still get a
   plan of their own, so that a much shorter batch does not swap what a long one needed.
2. **Scale (``SCALED``).** Otherwise the new shape is planned at once from the measured
   profile that, scaled to it (:func:`~lightning_accudnn.planner.scale_profile` with
   :func:`~lightning_accudnn.planner.shape_ratio`; layers whose growth is not known are
   counted at the bound over growth exponents 0 to 2, so bytes are never under-counted),
   gives the fewest saved bytes: the tightest of the bounds. The host link is the measured
   one; the static memory is today's.
3. **Profile.** When no other shape is known, or no plan fits the scaled profile (the
   conservative bound may over-count what a real step needs), the pass profiles.

Either way the pass runs with its layers hooked (a new shape cannot be replayed by ordinal: the
sizes differ), so its own sequence and measurements are recorded. A layer the plan does not
name (a branch taken only at this shape) is swapped, the safe side. After the pass the
session checks the measurements against the plan (:meth:`~.plan_book.PlanBook.departs`): a
scaled plan is re-made from the pass's own figures (``REFINED``), as after any first planned
pass; a reused plan is kept while the layers are its own and its peak holds, else re-made.

Example:
    >>> import torch
    >>> from lightning_accudnn.planner.plan import plan_swaps
    >>> from lightning_accudnn.profile import LayerProfile
    >>> from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource
    >>> def key(length):
    ...     return PassKey(model=1, batch=(((8, length), torch.int64),), position=0)
    >>> layers = tuple(LayerProfile(f"block{i}", 1_000, 1_000, 1e-3, 2e-3) for i in range(4))
    >>> book = PlanBook()
    >>> book.keep(key(64), plan_swaps(StepProfile(layers, static_bytes=0), 2_500), PlanSource.REFINED)
    >>> shapes = ShapePlanner(book, lambda profile, key: plan_swaps(profile, 2_500))
    >>> shapes.plan_for(key(40), static_bytes=0) is book.plan(key(64)), book.source(key(40))
    (True, <PlanSource.COVERED: 'covered'>)
    >>> shapes.plan_for(key(16), static_bytes=0).profile.saved_bytes, book.source(key(16))
    (4000, <PlanSource.SCALED: 'scaled'>)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from lightning_accudnn.ops import HostMemoryExceeded
from lightning_accudnn.planner.plan import BudgetTooSmallError, Plan
from lightning_accudnn.planner.scaling import ShapeRatio, plan_covers, scale_profile, shape_ratio
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource

__all__ = ["COVER_SHARE", "ShapePlanner", "same_pass_other_shape", "signature_ratio"]

log = logging.getLogger("lightning_accudnn")

#: A plan made for one shape is reused for a smaller shape of the same pass only down to this
#: share of its batch elements; below it the smaller shape is planned (scaled) on its own.
COVER_SHARE = 0.5

#: The sources whose plan was made for its own pass's shape (a reused plan was not).
_OWN_PLANS = (PlanSource.PROFILED, PlanSource.SCALED, PlanSource.REFINED)
#: The sources whose plan profile holds measured bytes of its own shape.
_MEASURED = (PlanSource.PROFILED, PlanSource.REFINED)


def same_pass_other_shape(a: PassKey, b: PassKey) -> bool:
    """Whether ``a`` and ``b`` are the same pass at other batch shapes: the same model, position
    in the step, number of batch tensors, their ranks and dtypes.

    Example:
        >>> import torch
        >>> a = PassKey(1, (((8, 64), torch.int64),), 0)
        >>> same_pass_other_shape(a, PassKey(1, (((8, 32), torch.int64),), 0))
        True
        >>> same_pass_other_shape(a, PassKey(1, (((8, 32), torch.float32),), 0))
        False
    """
    return (
        a.model == b.model
        and a.position == b.position
        and [(len(shape), dtype) for shape, dtype in a.batch]
        == [(len(shape), dtype) for shape, dtype in b.batch]
    )


def signature_ratio(profiled: PassKey, new: PassKey) -> ShapeRatio:
    """The :class:`~lightning_accudnn.planner.ShapeRatio` from ``profiled``'s batch to ``new``'s.

    Example:
        >>> import torch
        >>> long, short = (((8, 64), torch.int64),), (((4, 32), torch.int64),)
        >>> signature_ratio(PassKey(1, long, 0), PassKey(1, short, 0))
        ShapeRatio(batch=0.5, extent=0.5)
    """
    return shape_ratio([shape for shape, _ in profiled.batch], [shape for shape, _ in new.batch])


class ShapePlanner:
    """Plans a pass of a new batch shape from the plans of its other shapes (see the module doc).

    ``make_plan(profile, key)`` is the session's planner (budget, reserve, host-memory limit);
    it raises :class:`~lightning_accudnn.planner.BudgetTooSmallError` or
    :class:`~lightning_accudnn.ops.HostMemoryExceeded` when no plan fits, and the pass then
    profiles. Plans made here are kept in ``book``.

    Example:
        >>> import torch
        >>> from lightning_accudnn.planner.plan import plan_swaps
        >>> shapes = ShapePlanner(PlanBook(), lambda profile, key: plan_swaps(profile, 10_000))
        >>> print(shapes.plan_for(PassKey(1, (((8, 64), torch.int64),), 0), static_bytes=0))  # none known
        None
    """

    def __init__(self, book: PlanBook, make_plan: Callable[[StepProfile, PassKey], Plan]) -> None:
        self.book = book
        self.make_plan = make_plan

    def plan_for(self, key: PassKey, static_bytes: int) -> Plan | None:
        """A plan for ``key`` (not in the book) reused or scaled from other shapes of its pass,
        kept in the book as ``COVERED`` or ``SCALED``; ``None`` when the pass must profile."""
        others = [
            (other, plan, source)
            for other, plan, source in self.book.items()
            if other != key and same_pass_other_shape(other, key)
        ]
        if not others:
            return None
        covering = self._covering(key, static_bytes, others)
        if covering is not None:
            log.debug("accudnn: batch shape %s runs the plan of a larger shape of its pass", _shapes(key))
            self.book.keep(key, covering, PlanSource.COVERED)
            return covering
        scaled = self._tightest_scaled(key, static_bytes, others)
        if scaled is None:
            return None
        try:
            plan = self.make_plan(scaled, key)
        except (BudgetTooSmallError, HostMemoryExceeded) as error:
            log.info(
                "accudnn: no plan fits batch shape %s scaled from the shapes seen (%s); it profiles",
                _shapes(key),
                error,
            )
            return None
        log.debug("accudnn: batch shape %s planned from a scaled profile, not profiled", _shapes(key))
        self.book.keep(key, plan, PlanSource.SCALED)
        return plan

    def _covering(
        self, key: PassKey, static_bytes: int, others: list[tuple[PassKey, Plan, PlanSource]]
    ) -> Plan | None:
        """The plan of the smallest other shape that covers ``key`` and is at most
        ``1 / COVER_SHARE`` times its elements."""
        best: tuple[float, Plan] | None = None
        for other, plan, source in others:
            if source not in _OWN_PLANS:
                continue
            ratio = signature_ratio(other, key)
            if ratio.elements > 1 or ratio.elements < COVER_SHARE:
                continue
            profile = replace(scale_profile(plan.profile, ratio), static_bytes=static_bytes)
            if plan_covers(plan, profile) and (best is None or ratio.elements > best[0]):
                best = (ratio.elements, plan)
        return None if best is None else best[1]

    def _tightest_scaled(
        self, key: PassKey, static_bytes: int, others: list[tuple[PassKey, Plan, PlanSource]]
    ) -> StepProfile | None:
        """The measured profile of another shape scaled to ``key`` that has the fewest saved bytes."""
        best: StepProfile | None = None
        for other, plan, source in others:
            if source not in _MEASURED:
                continue
            profile = scale_profile(plan.profile, signature_ratio(other, key))
            if best is None or profile.saved_bytes < best.saved_bytes:
                best = profile
        return None if best is None else replace(best, static_bytes=static_bytes)


def _shapes(key: PassKey) -> str:
    return ", ".join("x".join(map(str, shape)) for shape, _ in key.batch)
