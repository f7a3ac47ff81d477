"""What one training pass measured, against what its plan predicted."""

from __future__ import annotations

import dataclasses

from lightning_accudnn.ops import StepStats
from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.session.plan_book import PlanSource

__all__ = ["OffloadStats", "measured_stats"]


@dataclasses.dataclass(frozen=True)
class OffloadStats:
    """Figures of the last training pass (forward and backward), kept as ``session.stats``.

    ``peak_device_bytes`` is ``torch.cuda.max_memory_allocated`` on CUDA and the engine's
    ledger (model state plus saved activations) on CPU; ``peak_reserved_bytes`` is the
    caching allocator's reserve on CUDA and equals the ledger on CPU. ``step_seconds`` is
    the measured forward plus backward time (CUDA events on GPU, wall clock on CPU; in a pass
    timed layer by layer, a profiling one among them, less the time compute waited on copies,
    so that it is the compute the performance model learns), ``forward_seconds`` and
    ``backward_seconds`` its two parts (in a pass replayed by ordinal, those of the latest pass
    the device finished, which on a GPU is usually the one before); the
    ``predicted_*`` figures are the plan's for this step (``None`` in a profiling step; on
    CUDA the peak counts, at each level of the plan, the memory no layer saves that the hooked
    passes measured there, such as a loss's working memory or kernel workspaces, and the most
    the allocator held above the plan's predictions in its earlier passes:
    :class:`~lightning_accudnn.session.shortfall.PredictionShortfall`)
    and the ``*_error`` figures are measured over predicted, less one. ``plan_source`` says
    how the pass was planned (:class:`~lightning_accudnn.session.plan_book.PlanSource`:
    ``profiling`` for a profiling step, else ``profiled``, ``scaled`` from another batch
    shape, ``covered`` by another shape's plan, or ``refined`` from its own measurements);
    the session always sets it. ``observed`` is false for a steady-state pass that ran with
    the engine's hooks only up to its plan's last swapped save, or with none when its plan
    keeps everything (one in ``OffloadConfig.observe_every`` of its kind is observed whole):
    on CPU its ledger figures are those of the last observed pass of its kind; on CUDA the
    allocator's peaks are measured every pass. ``storages_swapped_out`` counts the copies to
    the host (one per swapped storage, however many times it was saved). ``planning_seconds``
    is the host's wall-clock time this pass spent at the end of its backward planning the
    passes after it (0 when it planned nothing): not part of ``step_seconds``, but of the step
    a user waits for. ``background_planning_seconds`` is, on the pass that adopted a plan made
    on a planning thread (``OffloadConfig.plan_in_background``), that thread's time making it:
    time the training thread did not wait for. ``timed`` says the pass ran with the engine's
    hooks on every module and timed layer by layer (a profiling pass, a pass whose plan is being
    refined, or the first pass under a plan recomputing other segments): slower than a steady
    pass, and a sign that the plan may still change. ``steady_timing`` says the
    passes replayed under the plan in force are being timed whole (the forward, each
    recomputation), or were and the plan is not re-costed yet
    (:mod:`~lightning_accudnn.session.steady_costs`):
    the plan may be made again from them. ``recompute_cost_ratio`` is what their recomputations
    took over the forward time they repeat, as measured so far for this pass's kind (``None``
    until one was timed): on a GPU whose host issues the recomputed kernels more slowly than the
    device runs them, above 1. ``host_seconds_per_swapped_storage`` is the host's time in the
    engine's own work per swapped storage (its hooks, issuing its copy, bringing it back,
    releasing it), forward and backward together, the least measured so far for this pass's
    kind in its passes timed whole (``None`` until one that swapped was): times
    ``storages_swapped_out``, the host time the engine adds to a step. ``graph_changed`` says
    the pass, replayed by ordinal, saved other than the sequence it replayed: the next pass of
    its kind runs hooked and is planned from (a
    pass after pass with it set is a graph that changes every step, or saves the engine cannot
    replay).

    Example:
        >>> stats = OffloadStats(100, 100, 0.001, 900, 900, 900, 1, False, 0.01, 1_000, 0.008,
        ...                      plan_source=PlanSource.SCALED)
        >>> round(stats.peak_error, 2), round(stats.step_time_error, 2)
        (-0.1, 0.25)
        >>> metrics = stats.as_metrics()
        >>> [metrics[f"accudnn/{name}"] for name in ("bytes_swapped_out", "plan_scaled", "plan_profiling")]
        [100.0, 1.0, 0.0]
    """

    bytes_swapped_out: int
    bytes_swapped_in: int
    wait_seconds: float
    peak_device_bytes: int
    peak_reserved_bytes: int
    ledger_peak_bytes: int
    swapped_layers: int
    profiling: bool
    step_seconds: float
    predicted_peak_bytes: int | None = None
    predicted_step_seconds: float | None = None
    plan_source: PlanSource | None = None
    observed: bool = True
    storages_swapped_out: int = 0
    planning_seconds: float = 0.0
    background_planning_seconds: float = 0.0
    timed: bool = False
    steady_timing: bool = False
    recompute_cost_ratio: float | None = None
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    graph_changed: bool = False
    host_seconds_per_swapped_storage: float | None = None

    @property
    def peak_error(self) -> float | None:
        if not self.predicted_peak_bytes:
            return None
        return self.peak_device_bytes / self.predicted_peak_bytes - 1.0

    @property
    def step_time_error(self) -> float | None:
        if not self.predicted_step_seconds:
            return None
        return self.step_seconds / self.predicted_step_seconds - 1.0

    def as_metrics(self) -> dict[str, float]:
        """The figures as ``accudnn/*`` metrics for a logger (those that exist); how the pass
        was planned as ``accudnn/plan_<source>``, 1 for this pass's source and 0 for the others."""
        names = (
            "bytes_swapped_out",
            "storages_swapped_out",
            "bytes_swapped_in",
            "wait_seconds",
            "peak_device_bytes",
            "peak_reserved_bytes",
            "step_seconds",
            "forward_seconds",
            "backward_seconds",
            "peak_error",
            "step_time_error",
            "planning_seconds",
            "background_planning_seconds",
            "timed",
            "steady_timing",
            "recompute_cost_ratio",
            "host_seconds_per_swapped_storage",
        )
        values = {name: getattr(self, name) for name in names}
        metrics = {f"accudnn/{name}": float(value) for name, value in values.items() if value is not None}
        if self.plan_source is not None:
            for source in PlanSource:
                metrics[f"accudnn/plan_{source.value}"] = float(source is self.plan_source)
        return metrics


def measured_stats(
    step: StepStats,
    peaks: tuple[int, int] | None,
    plan: Plan | None,
    source: PlanSource,
    shortfall_bytes: int = 0,
) -> OffloadStats:
    """The figures of the pass ``step`` measured under ``plan`` (``None``: a profiling pass);
    ``peaks`` are the allocator's (peak allocated, peak reserved), or ``None`` where there is
    no allocator (the engine's ledger stands in). The predicted peak is the plan's (its
    ledger's and the working memory measured at each of its levels) plus ``shortfall_bytes``
    (:class:`~lightning_accudnn.session.shortfall.PredictionShortfall`)."""
    peak, reserved = (step.ledger_peak_bytes, step.ledger_peak_bytes) if peaks is None else peaks
    return OffloadStats(
        bytes_swapped_out=step.bytes_swapped_out,
        bytes_swapped_in=step.bytes_swapped_in,
        wait_seconds=step.wait_seconds,
        peak_device_bytes=peak,
        peak_reserved_bytes=reserved,
        ledger_peak_bytes=step.ledger_peak_bytes,
        swapped_layers=step.swapped_layers,
        profiling=plan is None,
        step_seconds=step.forward_seconds + step.backward_seconds,
        forward_seconds=step.forward_seconds,
        backward_seconds=step.backward_seconds,
        predicted_peak_bytes=None if plan is None else plan.predicted_peak_bytes + shortfall_bytes,
        predicted_step_seconds=None if plan is None else plan.predicted_step_seconds,
        plan_source=source,
        observed=step.observed,
        storages_swapped_out=step.storages_swapped_out,
        timed=step.timed,
        graph_changed=step.graph_changed,
    )
