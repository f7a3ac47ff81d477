"""One timed ``Trainer.fit`` of a workload under a strategy: step times, full collections, swaps.

Lightning runs the step exactly as a user's ``Trainer`` does (``accelerator="cpu"``, one
device), with the logger, checkpointing, progress bar and model summary off so that both
strategies pay as little unrelated per-step cost as possible. A step is timed from
``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward, optimizer step and
Lightning's own per-batch work); the first ``warmup`` steps (the strategy's profiling and
re-planning steps among them) are not measured.

Example:
    >>> from bench.overhead.models import tanhs
    >>> fit, _ = run_fit(tanhs(units=4), DEFAULT_STRATEGY, warmup=1, steps=2)
    >>> len(fit.step_seconds), fit.full_collections >= 0, fit.swapped_bytes_per_step
    (2, True, None)
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from bench.workloads import Workload
from lightning_accudnn import AccUDNNStrategy

#: Lightning's default strategy for one device.
DEFAULT_STRATEGY = "auto"
CPU = torch.device("cpu")

StrategyFactory = Callable[[], Any]


def accudnn(budget: int | str, min_swap_bytes: int = 0, observe_every: int | None = None) -> StrategyFactory:
    """A factory of ``AccUDNNStrategy(budget=..., min_swap_bytes=..., observe_every=...)`` (a fresh
    one per fit); ``observe_every`` ``None`` is the strategy's default. Plans are made at the end
    of their pass (``plan_in_background=False``), so that the steady state, which is the same
    either way, starts at the same step in every fit.

    Example:
        >>> type(accudnn("8GB")()).__name__
        'AccUDNNStrategy'
        >>> accudnn("8GB", observe_every=1)().offload_config.observe_every
        1
    """
    options: dict[str, Any] = {"plan_in_background": False}
    if observe_every is not None:
        options["observe_every"] = observe_every
    return lambda: AccUDNNStrategy(budget=budget, min_swap_bytes=min_swap_bytes, **options)


def offload_figures(strategy: Any) -> tuple[Any, Any] | None:
    """``(stats, plan)`` of an AccUDNN strategy through its public properties; ``None`` otherwise.

    The one place that knows where the strategy publishes its last step's figures.
    """
    if not isinstance(strategy, AccUDNNStrategy):
        return None
    return strategy.stats, strategy.plan


class FullCollections:
    """Counts generation-2 (full) garbage collections while :attr:`counting` is on.

    Example:
        >>> with FullCollections() as collections:
        ...     collections.counting = True
        ...     _ = gc.collect()
        >>> collections.count
        1
    """

    def __init__(self) -> None:
        self.count = 0
        self.counting = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if self.counting and phase == "start" and info["generation"] == 2:
            self.count += 1

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class StepClock(pl.Callback):
    """Times each training step and reads the strategy's figures after it.

    On CUDA the device is synchronised at both ends of a step, so a step's time includes
    the GPU's work as well as the host's.
    """

    def __init__(self, warmup: int, collections: FullCollections, device: torch.device) -> None:
        self.warmup = warmup
        self.device = device
        self.collections = collections
        self.seconds: list[float] = []
        self.swapped_bytes: list[int] = []
        self.swapped_storages: list[int] = []
        self.profiling_steps = 0
        self.observed_steps = 0
        self.plans: list[int] = []
        self.started = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self.collections.counting = trainer.global_step >= self.warmup
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - self.started
        self.collections.counting = False
        if trainer.global_step <= self.warmup:  # global_step counts optimizer steps taken
            return
        self.seconds.append(elapsed)
        figures = offload_figures(trainer.strategy)
        if figures is not None:
            stats, plan = figures
            self.swapped_bytes.append(stats.bytes_swapped_out)
            self.swapped_storages.append(stats.storages_swapped_out)
            self.profiling_steps += int(stats.profiling)
            self.observed_steps += int(stats.observed)
            self.plans.append(id(plan))


@dataclass(frozen=True)
class FitResult:
    """What one fit measured after its warm-up steps (``error`` set when the fit raised)."""

    step_seconds: list[float]
    full_collections: int
    swapped_bytes_per_step: int | None = None
    swapped_storages_per_step: int | None = None
    profiling_steps: int = 0
    observed_steps: int = 0  # whose saves passed the engine's hooks (see OffloadConfig.observe_every)
    replans: int = 0
    plan: dict[str, Any] | None = field(default=None, repr=False)
    error: str | None = None

    @property
    def median_seconds(self) -> float | None:
        return statistics.median(self.step_seconds) if self.step_seconds else None


def _plan_summary(plan: Any) -> dict[str, Any] | None:
    if plan is None:
        return None
    profile = plan.profile
    swapped = [index for index, swaps in enumerate(plan.swap) if swaps]
    return {
        "layers": len(profile.layers),
        "swapped_layers": len(plan.swapped_layers),
        "saved_bytes": profile.saved_bytes,
        "swappable_bytes": profile.swappable_bytes,
        "swapped_bytes": plan.swapped_bytes,
        "budget_bytes": plan.budget_bytes,
        "min_budget_bytes": plan.min_budget_bytes,
        "prefetch_window_bytes": plan.prefetch_window_bytes,
        "max_copying_out_bytes": plan.max_copying_out_bytes,
        "first_swapped_layer": swapped[0] if swapped else None,
        "last_swapped_layer": swapped[-1] if swapped else None,
    }


class WorkloadModule(pl.LightningModule):
    """A :class:`~bench.workloads.Workload` as a LightningModule: its model, loss and optimizer."""

    def __init__(self, workload: Workload) -> None:
        super().__init__()
        self.workload = workload
        self.model = workload.build()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.workload.loss(self.model, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.workload.optimizer(self.model)


def run_fit(
    workload: Workload,
    strategy: str | StrategyFactory,
    warmup: int,
    steps: int,
    device: torch.device = CPU,
) -> tuple[FitResult, Any]:
    """Fit ``workload`` for ``warmup + steps`` steps on one batch; the result and the strategy used.

    ``strategy`` is :data:`DEFAULT_STRATEGY` or a factory (see :func:`accudnn`); ``device``
    the CPU or a CUDA device (``accelerator="gpu"`` on that device).
    """
    torch.manual_seed(0)
    module = WorkloadModule(workload)
    batch = workload.make_batch(0)
    loader: DataLoader[Any] = DataLoader([batch] * (warmup + steps), batch_size=None)  # type: ignore[arg-type]
    with FullCollections() as collections:
        clock = StepClock(warmup, collections, device)
        trainer = pl.Trainer(
            accelerator="gpu" if device.type == "cuda" else "cpu",
            devices=[device.index or 0] if device.type == "cuda" else 1,
            strategy=strategy if isinstance(strategy, str) else strategy(),
            max_steps=warmup + steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=[clock],
        )
        error = None
        try:
            trainer.fit(module, train_dataloaders=loader)
        except Exception as raised:  # a failed fit is a result: the figures that need it are null
            message = str(raised).strip()
            error = f"{type(raised).__name__}: {message.splitlines()[0] if message else ''}"
    figures = offload_figures(trainer.strategy)
    swapped = int(statistics.median(clock.swapped_bytes)) if clock.swapped_bytes else None
    storages = int(statistics.median(clock.swapped_storages)) if clock.swapped_storages else None
    result = FitResult(
        step_seconds=clock.seconds,
        full_collections=collections.count,
        swapped_bytes_per_step=swapped,
        swapped_storages_per_step=storages,
        profiling_steps=clock.profiling_steps,
        observed_steps=clock.observed_steps,
        replans=sum(1 for a, b in zip(clock.plans, clock.plans[1:], strict=False) if a != b),
        plan=_plan_summary(figures[1]) if figures is not None else None,
        error=error,
    )
    return result, trainer.strategy
