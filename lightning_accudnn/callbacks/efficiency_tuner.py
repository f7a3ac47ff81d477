"""``EfficiencyTuner``: train at the batch size with the highest measured throughput under the budget.

A thin Lightning callback over :mod:`.batch_search` (which size), :mod:`.trials` (measure
one), :mod:`.prediction` (what the swap planner expects), :mod:`.lr_scaling` and
:mod:`.schedules` (the matching learning rate, applied by :mod:`.tuner_learning_rates`) and
:mod:`.training_snapshot` (undo the trials).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_accudnn.callbacks._lightning_internals import data_comes_from_module, train_dataset_length
from lightning_accudnn.callbacks.batch_search import (
    Prediction,
    SearchResult,
    Trial,
    candidate_batch_sizes,
    search_batch_size,
)
from lightning_accudnn.callbacks.decision import TunerDecision
from lightning_accudnn.callbacks.lr_scaling import LR_RULES, LinearWarmup, WarmupOverlay
from lightning_accudnn.callbacks.prediction import predict_batch_sizes
from lightning_accudnn.callbacks.rank_agreement import RankAgreement
from lightning_accudnn.callbacks.report import format_search_table, require_matplotlib, save_throughput_plot
from lightning_accudnn.callbacks.strategy_view import StrategyView
from lightning_accudnn.callbacks.training_snapshot import TrainingSnapshot
from lightning_accudnn.callbacks.trials import TrialSession, rebuild_dataloaders
from lightning_accudnn.callbacks.tuner_learning_rates import (
    check_learning_rates,
    choose_lr_factors,
    decision_hyperparams,
    scale_to_decision,
)

__all__ = ["EfficiencyTuner"]


class EfficiencyTuner(Callback):
    """Before training, find the per-device batch size with the highest measured samples/s,
    set it where the model or datamodule keeps it, and match the learning rate.

    **Batch size.** Candidates run from ``min_batch_size`` (default: the size the run
    starts with) up by ``growth`` to ``max_batch_size``, or are given as ``batch_sizes``.
    Under an AccUDNN strategy the smallest is measured first, then the swap planner,
    scaling that measured profile (activations grow with the batch, static memory does
    not), rules out the sizes no swap plan fits in the budget and predicts the others'
    time; the feasible ones are measured in increasing order. Under another strategy the
    candidates are measured until one runs out of memory (a warning says so). Each trial
    runs ``trial_warmup_steps`` untimed and ``steps_per_trial`` timed optimizer steps of the
    real fit loop; at most ``max_trials`` trials run, and the ladder stops once throughput
    falls more than ``tolerance`` below the best. Among the sizes within ``tolerance`` of
    the best throughput, the smallest wins. Weights, optimizer, scheduler and AMP state,
    random number generators and loop progress are put back after the trials.

    **Learning rate.** With ``k`` the new global batch (per-device batch x devices x
    gradient accumulation) over ``base_batch_size`` (default: the global batch the run
    started with), every optimizer's learning rate and schedule are scaled by ``k``
    (``"linear"``), ``sqrt(k)`` (``"sqrt"``), not at all (``"none"``), or by
    ``lr_scaling(k)`` for a callable; ``"auto"`` is ``"sqrt"`` for Adam-type optimizers and
    ``"linear"`` otherwise. Schedules keep their shape: their base rates are scaled, and
    schedules stepped every optimizer step (``interval="step"``) are stretched to the new
    number of steps of the run (OneCycleLR's ``total_steps``, CosineAnnealingLR's
    ``T_max``, ...). ``warmup_steps`` or ``warmup_epochs`` add a linear warmup (Goyal et al.
    2017) from ``warmup_start_factor`` (default ``1/factor``: the old learning rate),
    multiplied on top of the schedule during each step.

    **State.** The decision (:attr:`decision`) is saved in checkpoints; resuming with
    ``ckpt_path`` does not search again and keeps the batch size, the learning rates (they
    come back with the optimizer and scheduler state) and the warmup's progress. A table of
    the trials is printed at rank zero, the chosen values are logged as hyperparameters,
    and ``plot_path`` saves throughput against batch size as a PNG (needs matplotlib).

    **DDP.** Each rank searches its per-device batch alone (no gradient synchronisation);
    after every trial the ranks agree (a failure anywhere fails the trial everywhere, the
    slowest rank's throughput counts), so they choose the same size, and an out-of-memory
    error on one rank does not hang the others.

    Args:
        batch_arg_name: the attribute holding the batch size, looked up as Lightning does
            (model, ``model.hparams``, datamodule, ``datamodule.hparams``).
        min_batch_size: the smallest candidate (default: the current batch size).
        max_batch_size: the largest candidate per device.
        batch_sizes: explicit candidates (then ``min_batch_size``, ``max_batch_size`` and
            ``growth`` are not used).
        growth: factor between consecutive candidates.
        max_trials: most batch sizes measured.
        steps_per_trial: timed optimizer steps per trial.
        trial_warmup_steps: untimed optimizer steps first (default 2 under AccUDNN, whose
            first step at a new size runs hooked under a plan scaled from the sizes measured
            and the second re-plans from its own measurements; else 1).
        tolerance: share of the best throughput a smaller batch may give up and still win.
        lr_scaling: ``"auto"``, ``"linear"``, ``"sqrt"``, ``"none"`` or ``ratio -> factor``.
        base_batch_size: the global batch the configured learning rate was chosen for.
        warmup_steps: warmup length in optimizer steps.
        warmup_epochs: warmup length in epochs (at the new batch size); not with ``warmup_steps``.
        warmup_start_factor: the warmup's first factor (default ``1 / lr factor``, at most 1).
        rescale_step_schedules: stretch schedules stepped per optimizer step to the new
            number of steps of the run.
        plot_path: where to save the throughput plot (PNG), or ``None``.
        clock: the trials' time source in seconds (a fake one makes tests deterministic).

    Example:
        >>> import torch
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
        >>> from lightning_accudnn import AccUDNNStrategy, EfficiencyTuner
        >>> class Model(BoringModel):
        ...     def __init__(self, batch_size=4):
        ...         super().__init__()
        ...         self.batch_size = batch_size
        ...     def train_dataloader(self):
        ...         return torch.utils.data.DataLoader(RandomDataset(32, 256), batch_size=self.batch_size)
        >>> tuner = EfficiencyTuner(max_batch_size=16, warmup_epochs=1)
        >>> trainer = Trainer(accelerator="cpu", strategy=AccUDNNStrategy(budget="1GB"), callbacks=[tuner],
        ...                   max_epochs=1, logger=False, enable_checkpointing=False,
        ...                   enable_progress_bar=False, enable_model_summary=False)
        >>> model = Model()
        >>> trainer.fit(model)  # prints the table of trials
        >>> model.batch_size in (4, 8, 16), tuner.decision.lr_factors == [model.batch_size / 4]
        (True, True)
    """

    def __init__(
        self,
        *,
        batch_arg_name: str = "batch_size",
        min_batch_size: int | None = None,
        max_batch_size: int = 8192,
        batch_sizes: Sequence[int] | None = None,
        growth: float = 2.0,
        max_trials: int = 8,
        steps_per_trial: int = 3,
        trial_warmup_steps: int | None = None,
        tolerance: float = 0.05,
        lr_scaling: str | Callable[[float], float] = "auto",
        base_batch_size: int | None = None,
        warmup_steps: int | None = None,
        warmup_epochs: float | None = None,
        warmup_start_factor: float | None = None,
        rescale_step_schedules: bool = True,
        plot_path: str | Path | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not callable(lr_scaling) and lr_scaling not in LR_RULES:
            raise ValueError(
                f"lr_scaling must be one of {LR_RULES} or a callable ratio -> factor, got {lr_scaling!r}"
            )
        if warmup_steps is not None and warmup_epochs is not None:
            raise ValueError("give warmup_steps or warmup_epochs, not both")
        if (warmup_steps or 0) < 0 or (warmup_epochs or 0) < 0:
            raise ValueError("warmup_steps and warmup_epochs must be >= 0")
        if batch_sizes is not None and (not batch_sizes or min(batch_sizes) < 1):
            raise ValueError(f"batch_sizes must be a non-empty list of sizes >= 1, got {batch_sizes!r}")
        if min_batch_size is not None and min_batch_size < 1:
            raise ValueError(f"min_batch_size must be >= 1, got {min_batch_size}")
        if max_batch_size < 1 or max_trials < 1 or steps_per_trial < 1:
            raise ValueError("max_batch_size, max_trials and steps_per_trial must be >= 1")
        if trial_warmup_steps is not None and trial_warmup_steps < 1:
            raise ValueError(
                f"trial_warmup_steps must be >= 1 (it starts the clock), got {trial_warmup_steps}"
            )
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
        if base_batch_size is not None and base_batch_size < 1:
            raise ValueError(f"base_batch_size must be >= 1, got {base_batch_size}")
        if plot_path is not None:
            require_matplotlib()
        self.batch_arg_name = batch_arg_name
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size
        self.batch_sizes = None if batch_sizes is None else sorted(set(batch_sizes))
        self.growth = growth
        self.max_trials = max_trials
        self.steps_per_trial = steps_per_trial
        self.trial_warmup_steps = trial_warmup_steps
        self.tolerance = tolerance
        self.lr_scaling = lr_scaling
        self.base_batch_size = base_batch_size
        self.warmup_steps = warmup_steps
        self.warmup_epochs = warmup_epochs
        self.warmup_start_factor = warmup_start_factor
        self.rescale_step_schedules = rescale_step_schedules
        self.plot_path = None if plot_path is None else Path(plot_path)
        #: The decision in force (``None`` before tuning); saved in checkpoints.
        self.decision: TunerDecision | None = None
        #: The last search (``None`` when the decision came from a checkpoint).
        self.search_result: SearchResult | None = None
        self._restored = False
        self._lr_pending = False
        self._overlay: WarmupOverlay | None = None
        self.clock = clock

    # -- Lightning hooks ------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not data_comes_from_module(trainer):
            raise MisconfigurationException(
                "EfficiencyTuner changes the batch size and rebuilds the dataloaders, so it cannot use "
                "dataloaders passed straight to `Trainer.fit()`. Define `train_dataloader()` in your "
                "LightningModule or a LightningDataModule, building the loader from "
                f"`self.{self.batch_arg_name}`, and pass the module or `datamodule=` to fit."
            )
        if not lightning_hasattr(pl_module, self.batch_arg_name):
            raise MisconfigurationException(
                f"EfficiencyTuner found no batch-size attribute {self.batch_arg_name!r} in the "
                "LightningModule, its hparams, the datamodule or the datamodule's hparams. Keep the batch "
                f"size there (e.g. `self.{self.batch_arg_name} = {self.batch_arg_name}` or "
                "`self.save_hyperparameters()` in __init__) and build the train dataloader from it, or pass "
                "batch_arg_name= naming your attribute."
            )
        view = StrategyView(trainer.strategy)
        if not view.is_supported:
            raise MisconfigurationException(
                "EfficiencyTuner supports single-device and DDP strategies, not "
                f"{type(trainer.strategy).__name__}: use strategy=AccUDNNStrategy(budget=...) or "
                '"accudnn_ddp" (or plain "ddp"), or remove the tuner.'
            )
        if view.on_whole_model_route:
            raise MisconfigurationException(
                "EfficiencyTuner does not tune on the experimental whole-model route, and the strategy "
                "has whole_model_compile='experimental' set: that route plans from the first batch only and "
                "measures no step figures. Remove the tuner, or drop the option (compile the model's blocks "
                "one by one, regional compilation, to train it compiled)."
            )

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Before configure_optimizers and the dataloaders: both see the tuned batch size.
        state = checkpoint.get("callbacks", {}).get(self.state_key, {})
        decision = state.get("decision")
        if decision and lightning_hasattr(pl_module, self.batch_arg_name):
            lightning_setattr(pl_module, self.batch_arg_name, decision["batch_size"])

    def state_dict(self) -> dict[str, Any]:
        return {} if self.decision is None else {"decision": self.decision.to_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("decision"):
            self.decision = TunerDecision.from_dict(state_dict["decision"])
            self._restored = True

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.decision is not None:
            self._keep_decision(trainer, pl_module)
            self._restored = False  # a later fit without a checkpoint scales its new optimizers
            return
        if trainer.fast_dev_run:  # type: ignore[attr-defined]
            rank_zero_warn("EfficiencyTuner: skipped because fast_dev_run is on.")
            return
        if not StrategyView(trainer.strategy).runs_alone:
            raise MisconfigurationException(
                f"EfficiencyTuner: the strategy wraps the model in {type(trainer.strategy.model).__name__}, "
                "which it cannot run rank by rank; use a DDP or single-device strategy, or remove the tuner."
            )
        check_learning_rates(trainer.optimizers, self.lr_scaling)
        self._tune(trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After Lightning restored optimizer and scheduler state (resuming a run without a
        # decision restores it after on_fit_start): scale now, or the restore would undo it.
        if self._lr_pending and self.decision is not None:
            self._lr_pending = False
            scale_to_decision(trainer, self.decision, self.rescale_step_schedules)
            for logger in trainer.loggers:
                logger.log_hyperparams(decision_hyperparams(self.decision))
        self._attach_warmup(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._overlay is not None:
            self._overlay.detach()
            self._overlay = None

    # -- the search -----------------------------------------------------------------------

    def _tune(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        snapshot = TrainingSnapshot.take(trainer)  # first: building dataloaders draws random numbers
        start = int(lightning_getattr(pl_module, self.batch_arg_name) or 0)
        steps_before = trainer.estimated_stepping_batches
        agreement = RankAgreement()
        try:
            result = self._search(trainer, start, agreement)
        finally:
            snapshot.restore(trainer)
            lightning_setattr(pl_module, self.batch_arg_name, start)
        chosen = agreement.from_rank_zero(result.chosen)
        lightning_setattr(pl_module, self.batch_arg_name, chosen)
        rebuild_dataloaders(trainer)
        self.search_result = result
        self.decision = self._decide(trainer, pl_module, start, chosen, result, steps_before)
        self._lr_pending = True  # on_train_start, after any checkpoint restore
        snapshot.restore_rng()
        rank_zero_info("EfficiencyTuner:\n" + format_search_table(result, trainer.world_size))
        if self.plot_path is not None and trainer.is_global_zero:
            saved = save_throughput_plot(result, self.plot_path)
            rank_zero_info(f"EfficiencyTuner: throughput plot saved to {saved}")

    def _search(self, trainer: pl.Trainer, start: int, agreement: RankAgreement) -> SearchResult:
        view = StrategyView(trainer.strategy)
        candidates = self._candidates(trainer, start)
        warmup = self.trial_warmup_steps or (2 if view.is_offloading else 1)
        if not view.is_offloading:
            rank_zero_warn(
                f"EfficiencyTuner: the strategy {type(trainer.strategy).__name__} has no memory budget, so "
                "no planner says which batch sizes fit: candidates are measured one after the other, up "
                f"to max_batch_size={self.max_batch_size}, until one runs out of memory. Use "
                'strategy=AccUDNNStrategy(budget=...) (or "accudnn_ddp") to have the infeasible sizes '
                "ruled out by the swap planner instead."
            )
        rank_zero_info(
            f"EfficiencyTuner: measuring batch sizes {candidates} ({warmup} warm-up + "
            f"{self.steps_per_trial} timed steps each, at most {self.max_trials} trials)"
        )
        with TrialSession(trainer, self.batch_arg_name, warmup, self.steps_per_trial, self.clock) as session:

            def measure(batch_size: int) -> Trial:
                return agreement.trial(*session(batch_size))

            predict = self._predictor(view, agreement, session) if view.is_offloading else None
            return search_batch_size(
                candidates, measure, max_trials=self.max_trials, tolerance=self.tolerance, predict=predict
            )

    def _predictor(
        self, view: StrategyView, agreement: RankAgreement, session: TrialSession
    ) -> Callable[[Trial, Sequence[int]], dict[int, Prediction]]:
        """Rank zero's planner predictions from the profile its first trial measured."""

        def predict(first: Trial, sizes: Sequence[int]) -> dict[int, Prediction]:
            local: dict[int, Prediction] = {}
            view.wait_for_plans()  # the plan refined from the trial's warm passes
            plan, budget = view.plan, view.budget_bytes
            # The plan's profile is the first trial's unless its last batch was short (then the
            # plan is that batch's, scaled or reused from another shape).
            if plan is not None and budget is not None and session.probe.last_samples == first.batch_size:
                local = predict_batch_sizes(
                    plan.profile,
                    first.batch_size,
                    first.seconds_per_batch,
                    [first.batch_size, *sizes],
                    budget,
                    view.reserve_bytes,
                    add_largest=self.batch_sizes is None,
                    policy=plan.policy,
                    budget_for=view.smallest_budget_bytes,
                )
            return agreement.from_rank_zero(local)

        return predict

    def _candidates(self, trainer: pl.Trainer, start: int) -> list[int]:
        limit = _per_device_dataset_length(trainer)
        if self.batch_sizes is not None:
            sizes = [size for size in self.batch_sizes if limit is None or size <= limit]
        else:
            sizes = candidate_batch_sizes(
                self.min_batch_size or start, self.max_batch_size, self.growth, limit
            )
        if not sizes:
            raise MisconfigurationException(
                "EfficiencyTuner: no candidate batch size fits the training set "
                f"({limit} samples per device); lower min_batch_size or batch_sizes."
            )
        return sizes

    def _decide(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        start: int,
        chosen: int,
        result: SearchResult,
        steps_before: float,
    ) -> TunerDecision:
        accumulate = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
        world = trainer.world_size
        base = self.base_batch_size or start * world * accumulate
        decision = TunerDecision(
            batch_size=chosen,
            start_batch_size=start,
            base_global_batch_size=base,
            world_size=world,
            accumulate_grad_batches=accumulate,
            samples_per_second=result.chosen_trial.samples_per_second,
            trials=[_trial_record(t) for t in result.trials],
        )
        choose_lr_factors(decision, trainer.optimizers, self.lr_scaling, self.warmup_start_factor)
        steps_after = trainer.estimated_stepping_batches
        if math.isfinite(steps_before) and math.isfinite(steps_after) and steps_before > 0:
            decision.step_ratio = float(steps_after) / float(steps_before)
        decision.warmup_steps = self._warmup_length(trainer, accumulate)
        return decision

    def _warmup_length(self, trainer: pl.Trainer, accumulate: int) -> int:
        if self.warmup_steps is not None:
            return int(self.warmup_steps)
        if not self.warmup_epochs:
            return 0
        batches = trainer.num_training_batches
        if not math.isfinite(batches):
            raise MisconfigurationException(
                "EfficiencyTuner(warmup_epochs=...) needs a train dataloader with a length; "
                "give warmup_steps instead."
            )
        return math.ceil(self.warmup_epochs * math.ceil(batches / accumulate))

    # -- learning rates -------------------------------------------------------------------

    def _attach_warmup(self, trainer: pl.Trainer) -> None:
        decision = self.decision
        if self._overlay is not None:
            self._overlay.detach()
            self._overlay = None
        if decision is None or decision.warmup_steps <= 0 or decision.warmup_start_step is None:
            return
        start = decision.warmup_start_step
        self._overlay = WarmupOverlay(
            [LinearWarmup(decision.warmup_steps, factor) for factor in decision.warmup_start_factors],
            step=lambda: trainer.global_step - start,
        )
        self._overlay.attach(trainer.optimizers)

    # -- keeping a decision ---------------------------------------------------------------

    def _keep_decision(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        decision = self.decision
        assert decision is not None
        lightning_setattr(pl_module, self.batch_arg_name, decision.batch_size)
        rebuild_dataloaders(trainer)
        if self._restored:
            # Optimizer and scheduler state, already scaled, come back from the checkpoint.
            rank_zero_info(
                f"EfficiencyTuner: kept batch size {decision.batch_size} and learning-rate factors "
                f"{decision.lr_factors} from the checkpoint (no new search)"
            )
            return
        # A new fit with the same callback: configure_optimizers built unscaled optimizers.
        decision.step_ratio = 1.0
        self._lr_pending = True


def _per_device_dataset_length(trainer: pl.Trainer) -> int | None:
    length = train_dataset_length(trainer)
    if length is None:  # iterable-style datasets
        return None
    return max(1, math.ceil(length / max(1, trainer.world_size)))


def _trial_record(trial: Trial) -> dict[str, Any]:
    return {
        "batch_size": trial.batch_size,
        "samples_per_second": trial.samples_per_second,
        "peak_bytes": trial.peak_bytes,
        "failure": trial.failure,
    }
