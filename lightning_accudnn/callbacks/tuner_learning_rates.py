"""The tuner's learning rates: checked before the search, scaled after it, logged with the decision.

Pure functions over a Trainer's optimizers and schedulers and a
:class:`~lightning_accudnn.callbacks.decision.TunerDecision`, so that
:class:`~lightning_accudnn.callbacks.efficiency_tuner.EfficiencyTuner` stays a thin callback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.optim import Optimizer

from lightning_accudnn.callbacks.decision import TunerDecision
from lightning_accudnn.callbacks.lr_scaling import lr_factor, rule_for
from lightning_accudnn.callbacks.schedules import rescale_step_counts, scale_learning_rates

__all__ = ["check_learning_rates", "choose_lr_factors", "decision_hyperparams", "scale_to_decision"]


def check_learning_rates(optimizers: Sequence[Optimizer], lr_scaling: str | Callable[[float], float]) -> None:
    """Refuse to scale learning rates that are not there (no optimizer, or a param group without ``lr``).

    Example:
        >>> import torch
        >>> check_learning_rates([torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)], "auto")
        >>> check_learning_rates([], "none")  # nothing to scale
        >>> check_learning_rates([], "auto")
        Traceback (most recent call last):
        ...
        lightning.fabric.utilities.exceptions.MisconfigurationException: EfficiencyTuner scales the \
learning rate with the batch size, but there is no optimizer. Return an optimizer from \
configure_optimizers, or pass lr_scaling='none' to tune the batch size alone.
    """
    if lr_scaling == "none":
        return
    fix = (
        "Return an optimizer from configure_optimizers, or pass lr_scaling='none' to tune the "
        "batch size alone."
    )
    optimizers = [o for o in optimizers if type(o).__name__ != "_MockOptimizer"]
    if not optimizers:
        raise MisconfigurationException(
            f"EfficiencyTuner scales the learning rate with the batch size, but there is no optimizer. {fix}"
        )
    for optimizer in optimizers:
        if any("lr" not in group for group in optimizer.param_groups):
            raise MisconfigurationException(
                "EfficiencyTuner found no learning rate ('lr') to scale in "
                f"{type(optimizer).__name__}'s param groups. {fix}"
            )


def choose_lr_factors(
    decision: TunerDecision,
    optimizers: Sequence[Optimizer],
    lr_scaling: str | Callable[[float], float],
    warmup_start_factor: float | None,
) -> None:
    """Fill ``decision``'s rule, factor and warmup start factor per optimizer, for its batch ratio.

    Example:
        >>> import torch
        >>> decision = TunerDecision(batch_size=16, start_batch_size=4, base_global_batch_size=4)
        >>> sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> choose_lr_factors(decision, [sgd], "auto", None)
        >>> decision.lr_rules, decision.lr_factors, decision.warmup_start_factors
        (['linear'], [4.0], [0.25])
    """
    ratio = decision.batch_ratio
    for optimizer in optimizers:
        rule = rule_for(optimizer, lr_scaling)
        factor = lr_factor(rule, ratio)
        decision.lr_rules.append(rule if isinstance(rule, str) else "callable")
        decision.lr_factors.append(factor)
        start_factor = warmup_start_factor if warmup_start_factor is not None else 1.0 / factor
        decision.warmup_start_factors.append(min(1.0, start_factor))


def scale_to_decision(trainer: pl.Trainer, decision: TunerDecision, rescale_step_schedules: bool) -> None:
    """Scale every optimizer's learning rates and the schedules driving it by ``decision``'s
    factors; stretch schedules stepped every optimizer step to the run's new number of steps
    (a warning names those that cannot be); record the rates and the step the warmup starts at."""
    configs = trainer.lr_scheduler_configs
    for optimizer, factor in zip(trainer.optimizers, decision.lr_factors, strict=False):
        driving = [c.scheduler for c in configs if getattr(c.scheduler, "optimizer", None) is optimizer]
        scale_learning_rates(optimizer, driving, factor)
    if rescale_step_schedules and decision.step_ratio != 1.0:
        for config in configs:
            if config.interval == "step" and not rescale_step_counts(config.scheduler, decision.step_ratio):
                rank_zero_warn(
                    f"EfficiencyTuner: the run now takes {decision.step_ratio:.3g}x as many optimizer "
                    f"steps, but the length of {type(config.scheduler).__name__} (stepped every step) "
                    "cannot be rescaled; compute it from trainer.estimated_stepping_batches in "
                    "configure_optimizers, or pass rescale_step_schedules=False to silence this."
                )
    decision.learning_rates = [
        [float(group["lr"]) for group in optimizer.param_groups] for optimizer in trainer.optimizers
    ]
    decision.warmup_start_step = trainer.global_step


def decision_hyperparams(decision: TunerDecision) -> dict[str, Any]:
    """The decision as ``efficiency_tuner/*`` hyperparameters for a logger.

    Example:
        >>> decision = TunerDecision(batch_size=16, start_batch_size=4, base_global_batch_size=4)
        >>> decision.lr_factors, decision.learning_rates = [4.0], [[0.4]]
        >>> decision_hyperparams(decision)["efficiency_tuner/lr"]
        0.4
    """
    params: dict[str, Any] = {
        "efficiency_tuner/batch_size": decision.batch_size,
        "efficiency_tuner/global_batch_size": decision.global_batch_size,
        "efficiency_tuner/base_global_batch_size": decision.base_global_batch_size,
        "efficiency_tuner/warmup_steps": decision.warmup_steps,
    }
    if decision.samples_per_second is not None:
        params["efficiency_tuner/samples_per_second"] = decision.samples_per_second
    for index, (factor, rates) in enumerate(zip(decision.lr_factors, decision.learning_rates, strict=False)):
        suffix = "" if len(decision.lr_factors) == 1 else f"_{index}"
        params[f"efficiency_tuner/lr_factor{suffix}"] = factor
        if rates:
            params[f"efficiency_tuner/lr{suffix}"] = rates[0]
    return params
