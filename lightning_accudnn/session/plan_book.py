"""Plans remembered per distinct training pass: which batch shape, which pass of the step.

A training step may hold several forward/backward passes (a GAN's generator and
discriminator under manual optimization) and batches of several shapes (the short last
batch of an epoch). Each pass keeps its own plan, found again by a :class:`PassKey` before
its forward runs; after the pass the measured layer sequence is compared with the plan's,
so a pass whose graph changed anyway is re-planned from its own measurements. Each plan
remembers how it was made (:class:`PlanSource`): a pass of a new batch shape may run a plan
scaled from, or made for, another shape of the same pass (see :mod:`.shapes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.planner.scaling import plan_covers
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.session._torch_internals import tensor_leaves
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES

__all__ = ["PassKey", "PlanBook", "PlanSource", "batch_signature", "layers_differ"]

BatchSignature = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def batch_signature(batch: Any) -> BatchSignature:
    """Shapes and dtypes of the tensors in ``batch`` (any nesting of lists, tuples, dicts).

    Example:
        >>> batch_signature({"x": torch.zeros(8, 3), "y": [torch.zeros(8, dtype=torch.long), "id"]})
        (((8, 3), torch.float32), ((8,), torch.int64))
    """
    return tuple((tuple(leaf.shape), leaf.dtype) for leaf in tensor_leaves(batch))


@dataclass(frozen=True)
class PassKey:
    """One distinct pass: the model it trains, the batch's shapes and its position in the step.

    Example:
        >>> PassKey(model=1, batch=(((8, 3), torch.float32),), position=0).position
        0
    """

    model: int
    batch: BatchSignature
    position: int


class PlanSource(str, Enum):
    """How the plan a pass ran under was made (``OffloadStats.plan_source``).

    * ``PROFILING``: no plan; the pass profiled itself in the safe mode (everything swapped).
    * ``PROFILED``: made from this pass's profiling step (its timings are distorted by the
      swapping, so the next pass re-plans: ``REFINED``).
    * ``SCALED``: made from the profile of another batch shape of the same pass, scaled to
      this shape (the first pass of a shape not seen before; the next pass re-plans from this
      one's own measurements: ``REFINED``).
    * ``COVERED``: the plan made for another batch shape of the same pass, reused because its
      predicted peak does not grow at this shape (kept while this shape's own measurements
      confirm it).
    * ``REFINED``: made from a planned pass of this very shape (its own bytes and timings).

    Example:
        >>> PlanSource.SCALED.value, PlanSource("covered") is PlanSource.COVERED
        ('scaled', True)
    """

    PROFILING = "profiling"
    PROFILED = "profiled"
    SCALED = "scaled"
    COVERED = "covered"
    REFINED = "refined"


@dataclass
class _Entry:
    plan: Plan
    source: PlanSource


class PlanBook:
    """The plan of every pass seen so far, and how it was made.

    Example:
        >>> book = PlanBook()
        >>> key = PassKey(0, (), 0)
        >>> book.plan(key) is None, book.needs_refining(key), book.source(key)
        (True, False, <PlanSource.PROFILING: 'profiling'>)
    """

    def __init__(self) -> None:
        self._entries: dict[PassKey, _Entry] = {}
        self._timed: dict[PassKey, int] = {}  # planned passes timed layer by layer, per pass

    def plan(self, key: PassKey) -> Plan | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.plan

    def source(self, key: PassKey) -> PlanSource:
        """How the pass's plan was made; ``PROFILING`` when it has none (the pass profiles)."""
        entry = self._entries.get(key)
        return PlanSource.PROFILING if entry is None else entry.source

    def needs_refining(self, key: PassKey) -> bool:
        """True while the pass has a plan made from another pass's figures (a profiling pass's
        distorted timings, or another batch shape's scaled profile), or from fewer than
        :data:`~lightning_accudnn.session.warm_times.TIMED_PLANNED_PASSES` timed planned passes
        of its own (the first run cold)."""
        entry = self._entries.get(key)
        if entry is None:
            return False
        if entry.source in (PlanSource.PROFILED, PlanSource.SCALED):
            return True
        return entry.source is PlanSource.REFINED and not self.timed_enough(key)

    def timed_enough(self, key: PassKey) -> bool:
        """Whether :data:`~lightning_accudnn.session.warm_times.TIMED_PLANNED_PASSES` planned
        passes of ``key`` were timed: the times to refine its plan from are warm."""
        return self._timed.get(key, 0) >= TIMED_PLANNED_PASSES

    def note_timed(self, key: PassKey) -> None:
        """A planned pass of ``key`` was timed layer by layer."""
        self._timed[key] = self._timed.get(key, 0) + 1

    def keep(self, key: PassKey, plan: Plan, source: PlanSource) -> None:
        if source is PlanSource.PROFILING:
            raise ValueError("a plan kept in the book has a source other than PROFILING (which means none)")
        self._entries[key] = _Entry(plan, source)

    def replan(self, key: PassKey, plan: Plan) -> None:
        """Replace the pass's plan by one re-made from the same figures (a new static memory or
        reserve): how it was made does not change."""
        self._entries[key].plan = plan

    def departs(self, key: PassKey, measured: StepProfile) -> bool:
        """Whether ``measured`` (a pass of ``key`` just ran) departs from what its plan holds.

        A plan reused from another shape (``COVERED``) holds while the layers are its own, in
        order, and the measured figures do not raise its predicted peak
        (:func:`~lightning_accudnn.planner.plan_covers`); any other plan while the measured
        layers and sizes are the plan's (:func:`layers_differ`). No plan: departs.
        """
        entry = self._entries.get(key)
        if entry is None:
            return True
        if entry.source is PlanSource.COVERED:
            return not plan_covers(entry.plan, measured)
        return layers_differ(entry.plan.profile, measured)

    def passes(self) -> list[PassKey]:
        """The passes with a plan, in the order they were first seen."""
        return list(self._entries)

    def items(self) -> list[tuple[PassKey, Plan, PlanSource]]:
        """Every pass with its plan and how the plan was made, in the order first seen."""
        return [(key, entry.plan, entry.source) for key, entry in self._entries.items()]

    def __len__(self) -> int:
        return len(self._entries)


def layers_differ(old: StepProfile, new: StepProfile) -> bool:
    """True when the two profiles saw different layer invocations or sizes (the graph changed).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> a = StepProfile((LayerProfile("x", 10, 10),), static_bytes=0)
        >>> layers_differ(a, StepProfile((LayerProfile("x", 20, 20),), static_bytes=0))
        True
    """
    return [(layer.name, layer.saved_bytes) for layer in old.layers] != [
        (layer.name, layer.saved_bytes) for layer in new.layers
    ]
