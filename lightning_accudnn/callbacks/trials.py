"""Measure training throughput at a batch size by running a few real steps of the fit loop.

:class:`TrialSession` prepares the Trainer for short trials and puts it back afterwards (as
Lightning's ``BatchSizeFinder`` does): no loggers, no other callbacks, no validation, a step
bound per trial, and, under DDP, each rank on its own: the model is run unwrapped (no
gradient all-reduce, no buffer broadcast), the loop's per-step SIGTERM broadcast is off
and an AccUDNN strategy plans per rank. Nothing inside a trial then waits for another
rank, so an out-of-memory error on one rank cannot hang the others; ranks agree once per
trial instead (see :mod:`.rank_agreement`).

:class:`ThroughputProbe` times the steps after the warm-up ones (the first steps at a new
size allocate, and an AccUDNN strategy plans the new size in them): samples per second is the
number of samples in the timed batches over the time from the end of the last warm-up
batch to the end of the last batch, data loading included.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers.logger import DummyLogger
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.memory import garbage_collection_cuda, is_oom_error
from lightning.pytorch.utilities.parsing import lightning_setattr
from torch.nn.parallel import DistributedDataParallel

from lightning_accudnn.callbacks._lightning_internals import (
    rebuild_train_dataloader,
    reset_logged_results,
    restore_sigterm_broadcast,
    skip_sigterm_broadcast,
)
from lightning_accudnn.callbacks.batch_search import Trial
from lightning_accudnn.callbacks.strategy_view import StrategyView
from lightning_accudnn.callbacks.training_snapshot import not_restarting
from lightning_accudnn.planner import BudgetTooSmallError

__all__ = ["ThroughputProbe", "TrialSession", "failure_reason", "rebuild_dataloaders"]

Clock = Callable[[], float]


def rebuild_dataloaders(trainer: pl.Trainer) -> None:
    """Build the train dataloader again (the batch size changed); validation's is rebuilt when needed.

    Unlike ``lightning.pytorch.tuner.batch_size_scaling._reset_dataloaders``, the validation
    dataloader is not requested here: a module with a ``validation_step`` but no
    ``val_dataloader`` would raise.
    """
    rebuild_train_dataloader(trainer)


def failure_reason(error: BaseException) -> str | None:
    """``"out of memory"`` or ``"over budget"`` for the errors that mean "too large"; else ``None``.

    Example:
        >>> failure_reason(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        'out of memory'
        >>> failure_reason(ValueError("a bug")) is None
        True
    """
    if isinstance(error, BudgetTooSmallError):
        return f"over budget (needs {error.min_budget_bytes / 1e9:.2f} GB)"
    if isinstance(error, torch.OutOfMemoryError) or is_oom_error(error):
        return "out of memory"
    return None


class ThroughputProbe(Callback):
    """Times training batches after ``warmup_batches`` of them; see the module docstring.

    Example:
        >>> ticks = iter([0.0, 1.0, 1.5, 2.0])
        >>> probe = ThroughputProbe(warmup_batches=1, clock=lambda: next(ticks))
        >>> for _ in range(4):
        ...     probe.record(samples=8, peak_bytes=None)
        >>> probe.samples_per_second(), probe.seconds_per_batch()
        (12.0, 0.6666666666666666)
    """

    def __init__(self, warmup_batches: int, clock: Clock = time.perf_counter) -> None:
        if warmup_batches < 1:
            raise ValueError(f"at least one warm-up batch is needed to start the clock, got {warmup_batches}")
        self.warmup_batches = warmup_batches
        self.clock = clock
        self.view: StrategyView | None = None
        self.batch_size = 1
        self._ends: list[float] = []
        self._samples: list[int] = []
        self._peaks: list[int] = []

    def reset(self, batch_size: int = 1) -> None:
        """Forget the last trial; ``batch_size`` counts a batch whose size cannot be read."""
        self.batch_size = batch_size
        self._ends, self._samples, self._peaks = [], [], []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if len(self._ends) == self.warmup_batches - 1 and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        peak = self.view.peak_bytes if self.view is not None else None
        if peak is None and device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
        self.record(_samples_in(batch, self.batch_size), peak)

    def record(self, samples: int, peak_bytes: int | None) -> None:
        self._ends.append(self.clock())
        self._samples.append(samples)
        if peak_bytes is not None and len(self._ends) > self.warmup_batches:
            self._peaks.append(peak_bytes)

    @property
    def last_samples(self) -> int | None:
        """Samples in the last batch seen (``None`` before the first)."""
        return self._samples[-1] if self._samples else None

    @property
    def timed_batches(self) -> int:
        return max(0, len(self._ends) - self.warmup_batches)

    def samples_per_second(self) -> float | None:
        if self.timed_batches == 0:
            return None
        elapsed = self._ends[-1] - self._ends[self.warmup_batches - 1]
        samples = sum(self._samples[self.warmup_batches :])
        return samples / elapsed if elapsed > 0 else float("inf")

    def seconds_per_batch(self) -> float | None:
        if self.timed_batches == 0:
            return None
        return (self._ends[-1] - self._ends[self.warmup_batches - 1]) / self.timed_batches

    def peak_bytes(self) -> int | None:
        return max(self._peaks) if self._peaks else None


class TrialSession:
    """The Trainer set up for trials while the ``with`` block runs; call the session to run one.

    ``session(batch_size)`` sets the batch size where the user keeps it, rebuilds the
    dataloaders, runs ``warmup_steps + steps`` optimizer steps of the fit loop from the
    progress the session started with, and returns this rank's :class:`Trial` and the
    unexpected error it raised, if any (an out-of-memory error or a budget too small is a
    failed trial, not an error).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
        >>> class Model(BoringModel):
        ...     batch_size = 4
        ...     def train_dataloader(self):
        ...         return torch.utils.data.DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)
        >>> class Measure(Callback):
        ...     def on_fit_start(self, trainer, pl_module):
        ...         with TrialSession(trainer, "batch_size", warmup_steps=1, steps=2) as session:
        ...             self.trial, self.error = session(16)
        >>> measure = Measure()
        >>> trainer = Trainer(accelerator="cpu", max_steps=1, callbacks=[measure], logger=False,
        ...                   enable_checkpointing=False, enable_progress_bar=False,
        ...                   enable_model_summary=False)
        >>> trainer.fit(Model())
        >>> measure.trial.batch_size, measure.trial.ok, measure.error
        (16, True, None)
    """

    def __init__(
        self,
        trainer: pl.Trainer,
        batch_arg_name: str,
        warmup_steps: int,
        steps: int,
        clock: Clock = time.perf_counter,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps per trial must be >= 1, got {steps}")
        self.trainer = trainer
        self.batch_arg_name = batch_arg_name
        self.warmup_steps = warmup_steps
        self.steps = steps
        self.view = StrategyView(trainer.strategy)
        accumulate = trainer.accumulate_grad_batches if trainer.lightning_module.automatic_optimization else 1
        self.probe = ThroughputProbe(max(1, warmup_steps * accumulate), clock=clock)
        self.probe.view = self.view if self.view.is_offloading else None
        self._saved: dict[str, Any] = {}
        self._planning = self.view.planning_alone()
        self._quiet = _QuietTrialEnds()

    # -- the session ----------------------------------------------------------------------

    def __enter__(self) -> TrialSession:
        trainer = self.trainer
        loop = trainer.fit_loop
        strategy = trainer.strategy
        self._saved = {
            "loggers": trainer.loggers,
            "callbacks": trainer.callbacks,  # type: ignore[attr-defined]
            "limit_train_batches": trainer.limit_train_batches,
            "limit_val_batches": trainer.limit_val_batches,
            "max_steps": loop.epoch_loop.max_steps,
            "max_epochs": loop.max_epochs,
            "loop_state": copy.deepcopy(loop.state_dict()),
            "model": strategy.model,
        }
        trainer.loggers = [DummyLogger()] if trainer.loggers else []
        trainer.callbacks = [self.probe]  # type: ignore[attr-defined]
        trainer.limit_train_batches = 1.0
        trainer.limit_val_batches = 0
        loop.max_epochs = -1
        loop.epoch_loop.max_steps = self.warmup_steps + self.steps
        if isinstance(strategy.model, DistributedDataParallel):
            # Run the LightningModule itself: no gradient all-reduce, no buffer broadcast.
            strategy.model = strategy.lightning_module
        # The loop broadcasts a SIGTERM flag every step under DDP; a rank that failed would
        # answer that broadcast from elsewhere. Trials are short: skip it.
        skip_sigterm_broadcast(trainer)
        self._planning.__enter__()
        for log in _RANK_ZERO_LOGS:
            log.addFilter(self._quiet)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        trainer = self.trainer
        loop = trainer.fit_loop
        saved = self._saved
        for log in _RANK_ZERO_LOGS:
            log.removeFilter(self._quiet)
        self._planning.__exit__(kind, error, traceback)
        restore_sigterm_broadcast(trainer)
        trainer.strategy.model = saved["model"]
        trainer.loggers = saved["loggers"]
        trainer.callbacks = saved["callbacks"]  # type: ignore[attr-defined]
        trainer.limit_train_batches = saved["limit_train_batches"]
        trainer.limit_val_batches = saved["limit_val_batches"]
        loop.max_epochs = saved["max_epochs"]
        loop.epoch_loop.max_steps = saved["max_steps"]
        loop.load_state_dict(copy.deepcopy(saved["loop_state"]))
        not_restarting(loop)
        reset_logged_results(trainer)

    # -- one trial ------------------------------------------------------------------------

    def __call__(self, batch_size: int) -> tuple[Trial, BaseException | None]:
        trainer = self.trainer
        lightning_setattr(trainer.lightning_module, self.batch_arg_name, batch_size)
        rebuild_dataloaders(trainer)
        self.probe.reset(batch_size)
        loop = trainer.fit_loop
        loop.load_state_dict(copy.deepcopy(self._saved["loop_state"]))
        not_restarting(loop)
        trainer.should_stop = False
        try:
            loop.run()
        except Exception as error:  # classified below; every rank reports before anyone raises
            self.view.abort_step(error)
            trainer.lightning_module.zero_grad(set_to_none=True)
            garbage_collection_cuda()
            reason = failure_reason(error)
            if reason is None:
                return Trial(batch_size, failure=f"error: {type(error).__name__}"), error
            return Trial(batch_size, failure=reason), None
        rate = self.probe.samples_per_second()
        if rate is None:
            return Trial(batch_size, failure="no timed step (too few batches?)"), None
        return (
            Trial(
                batch_size,
                samples_per_second=rate,
                seconds_per_batch=self.probe.seconds_per_batch(),
                peak_bytes=self.probe.peak_bytes(),
            ),
            None,
        )


class _QuietTrialEnds(logging.Filter):
    """Drops the fit loop's "`Trainer.fit` stopped: `max_steps=...` reached." after each trial."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("`Trainer.fit` stopped")


_RANK_ZERO_LOGS = [
    logging.getLogger(f"lightning.{part}.utilities.rank_zero") for part in ("pytorch", "fabric")
]


def _samples_in(batch: Any, default: int) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return int(extract_batch_size(batch))
        except Exception:  # no tensor to read it from: the size the loader was asked for
            return default
