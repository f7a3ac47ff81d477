"""Every use of a private attribute of PyTorch's learning-rate schedulers in the tuner."""

from __future__ import annotations

from typing import Any

from torch.optim import lr_scheduler as schedulers

__all__ = ["child_schedulers", "one_cycle_phases", "sequential_milestones", "set_sequential_milestones"]


def sequential_milestones(scheduler: schedulers.SequentialLR) -> list[int]:
    return list(scheduler._milestones)


def set_sequential_milestones(scheduler: schedulers.SequentialLR, milestones: list[int]) -> None:
    scheduler._milestones = milestones


def child_schedulers(scheduler: schedulers.SequentialLR | schedulers.ChainedScheduler) -> list[Any]:
    return list(scheduler._schedulers)


def one_cycle_phases(scheduler: schedulers.OneCycleLR) -> list[Any]:
    """The phase dicts (``end_step`` and the rest) that ``OneCycleLR`` keeps and reads each step."""
    phases: list[Any] = scheduler._schedule_phases
    return phases
