"""Scale a live optimizer and its schedulers consistently, so the user's schedule composes.

Changing only ``param_groups[i]["lr"]`` after ``configure_optimizers`` does not last:
schedulers recompute the rate from their ``base_lrs`` (or OneCycleLR from the group's
``max_lr``/``initial_lr``/``min_lr``). :func:`scale_learning_rates` multiplies every value a
schedule is computed from, so the whole schedule is scaled by the factor: its shape is
kept. Both the optimizer's and the schedulers' values are in their state dicts, so
Lightning's checkpoints save and restore the scaled schedule.

A schedule counted in optimizer steps spans a different share of the run once the batch
size changes (``OneCycleLR(total_steps=trainer.estimated_stepping_batches)`` would raise
when stepped past its end after a smaller batch, and would never finish after a larger
one). :func:`rescale_step_counts` multiplies its step counts by the change in the number
of optimizer steps of the run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import torch
from torch.optim import Optimizer
from torch.optim import lr_scheduler as schedulers

from lightning_accudnn.callbacks._torch_internals import (
    child_schedulers,
    one_cycle_phases,
    sequential_milestones,
    set_sequential_milestones,
)

__all__ = ["rescale_step_counts", "scale_learning_rates", "scale_optimizer", "scale_scheduler"]

#: Param-group entries holding learning rates (OneCycleLR keeps three of its own).
GROUP_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
#: Scheduler attributes holding one learning rate per param group.
SCHEDULER_LR_LISTS = ("base_lrs", "_last_lr", "max_lrs", "min_lrs")


def scale_optimizer(optimizer: Optimizer, factor: float) -> None:
    """Multiply each param group's learning rates (``lr`` and schedulers' copies) by ``factor``.

    Example:
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> scale_optimizer(optimizer, 4.0)
        >>> optimizer.param_groups[0]["lr"]
        0.4
    """
    for group in optimizer.param_groups:
        for key in GROUP_LR_KEYS:
            if key not in group:
                continue
            value = group[key]
            if isinstance(value, torch.Tensor):
                value.mul_(factor)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                group[key] = value * factor


def scale_scheduler(scheduler: object, factor: float) -> None:
    """Multiply the learning rates a scheduler computes from (nested schedulers included).

    ``base_lrs``, the last rates, CyclicLR's ``max_lrs``, ReduceLROnPlateau's ``min_lrs`` and
    the cosine schedules' ``eta_min`` are scaled; the param groups are not (see
    :func:`scale_optimizer`).

    Example:
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10, eta_min=0.01)
        >>> scale_scheduler(cosine, 2.0)
        >>> cosine.base_lrs, cosine.eta_min
        ([0.2], 0.02)
    """
    for item in _walk(scheduler):
        for name in SCHEDULER_LR_LISTS:
            values = getattr(item, name, None)
            if isinstance(values, list):
                setattr(item, name, [_scaled(v, factor) for v in values])
        eta_min = getattr(item, "eta_min", None)
        if isinstance(eta_min, (int, float)) and not isinstance(eta_min, bool):
            item.eta_min = eta_min * factor  # type: ignore[attr-defined]


def scale_learning_rates(
    optimizer: Optimizer, schedulers_of_optimizer: Iterable[object], factor: float
) -> None:
    """Scale ``optimizer`` and the schedulers driving it by ``factor``: the schedule keeps its shape.

    Example:
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        >>> scale_learning_rates(optimizer, [step], 4.0)
        >>> optimizer.step(); step.step()
        >>> optimizer.param_groups[0]["lr"], step.base_lrs
        (0.2, [0.4])
    """
    scale_optimizer(optimizer, factor)
    for scheduler in schedulers_of_optimizer:
        scale_scheduler(scheduler, factor)


def rescale_step_counts(scheduler: object, ratio: float) -> bool:
    """Multiply a step-counted schedule's lengths by ``ratio`` (new steps of the run over old).

    Handles OneCycleLR (``total_steps`` and its phases), CosineAnnealingLR (``T_max``),
    CosineAnnealingWarmRestarts (``T_0``), StepLR (``step_size``), MultiStepLR
    (``milestones``), LinearLR/ConstantLR/PolynomialLR (``total_iters``), ExponentialLR
    (``gamma`` per step, so the decay over the run is kept), CyclicLR (cycle length) and
    SequentialLR/ChainedScheduler (their milestones and parts). Returns False for a
    schedule it cannot rescale (``LambdaLR``, ``MultiplicativeLR``, user classes): its
    lengths are left as they were. Lengths are rounded up and kept >= 1.

    Example:
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        >>> one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=400)
        >>> rescale_step_counts(one_cycle, 0.25), one_cycle.total_steps
        (True, 100)
    """
    if ratio == 1.0:
        return True
    if ratio <= 0 or not math.isfinite(ratio):
        raise ValueError(f"ratio must be positive and finite, got {ratio}")
    if isinstance(scheduler, schedulers.OneCycleLR):
        _rescale_one_cycle(scheduler, ratio)
    elif isinstance(scheduler, schedulers.CosineAnnealingLR):
        scheduler.T_max = _steps(scheduler.T_max, ratio)
    elif isinstance(scheduler, schedulers.CosineAnnealingWarmRestarts):
        scheduler.T_0 = _steps(scheduler.T_0, ratio)
        scheduler.T_i = _steps(scheduler.T_i, ratio)
    elif isinstance(scheduler, schedulers.StepLR):
        scheduler.step_size = _steps(scheduler.step_size, ratio)
    elif isinstance(scheduler, schedulers.MultiStepLR):
        scheduler.milestones = Counter({_steps(m, ratio): n for m, n in scheduler.milestones.items()})
    elif isinstance(scheduler, (schedulers.LinearLR, schedulers.ConstantLR, schedulers.PolynomialLR)):
        scheduler.total_iters = _steps(scheduler.total_iters, ratio)
    elif isinstance(scheduler, schedulers.ExponentialLR):
        scheduler.gamma = scheduler.gamma ** (1.0 / ratio)
    elif isinstance(scheduler, schedulers.CyclicLR):
        scheduler.total_size = float(_steps(scheduler.total_size, ratio))  # type: ignore[assignment]
    elif isinstance(scheduler, schedulers.SequentialLR):
        set_sequential_milestones(scheduler, [_steps(m, ratio) for m in sequential_milestones(scheduler)])
        return all([rescale_step_counts(part, ratio) for part in child_schedulers(scheduler)])
    elif isinstance(scheduler, schedulers.ChainedScheduler):
        return all([rescale_step_counts(part, ratio) for part in child_schedulers(scheduler)])
    else:
        return False
    return True


def _rescale_one_cycle(scheduler: schedulers.OneCycleLR, ratio: float) -> None:
    old_total = scheduler.total_steps
    new_total = _steps(old_total, ratio)
    phases = one_cycle_phases(scheduler)
    pct_start = (float(phases[0]["end_step"]) + 1.0) / old_total
    if len(phases) == 3:
        ends = [pct_start * new_total - 1, 2 * pct_start * new_total - 2, new_total - 1]
    else:
        ends = [pct_start * new_total - 1, new_total - 1]
    for phase, end in zip(phases, ends, strict=True):
        phase["end_step"] = float(end)
    scheduler.total_steps = new_total


def _steps(count: float, ratio: float) -> int:
    return max(1, math.ceil(count * ratio - 1e-9))


def _scaled(value: object, factor: float) -> object:
    if isinstance(value, torch.Tensor):
        return value * factor
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value * factor
    return value


def _walk(scheduler: object) -> list[object]:
    """``scheduler`` and the schedulers nested in it, each once."""
    seen: dict[int, object] = {}
    stack = [scheduler]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen[id(item)] = item
        stack.extend(getattr(item, "_schedulers", []) or [])
    return list(seen.values())
