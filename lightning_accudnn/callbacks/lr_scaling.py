"""Learning-rate rules for a changed batch size, and gradual warmup on top of any schedule.

A batch ``k`` times larger takes ``k`` times fewer optimizer steps per epoch; to keep the
training trajectory, SGD-type optimizers scale the learning rate by ``k`` (linear scaling,
Goyal et al. 2017, "Accurate, Large Minibatch SGD") and Adam-type optimizers by ``sqrt(k)``
(their update is normalised by the gradient's second moment, whose noise shrinks as
``1/sqrt(k)``). The larger rate is reached by a gradual warmup from the old one.

:class:`LinearWarmup` is a plain function of the step (usable as ``LambdaLR``'s
``lr_lambda``); :class:`WarmupOverlay` multiplies the learning rates by it inside each
``optimizer.step()`` only, so that whatever scheduler the user has keeps computing from
the unwarmed values and nothing warmed reaches a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = [
    "ADAPTIVE_OPTIMIZERS",
    "LR_RULES",
    "LinearWarmup",
    "WarmupOverlay",
    "lr_factor",
    "rule_for",
]

#: Optimizer class names scaled by the square-root rule under ``"auto"`` (per-parameter
#: adaptive step sizes); any other optimizer is treated as SGD-type unless listed here.
ADAPTIVE_OPTIMIZERS = frozenset(
    {
        "Adam",
        "AdamW",
        "Adamax",
        "NAdam",
        "RAdam",
        "SparseAdam",
        "Adagrad",
        "Adadelta",
        "RMSprop",
        "Adafactor",
        "LAMB",
        "Lamb",
        "FusedAdam",
        "FusedLAMB",
        "DeepSpeedCPUAdam",
        "Adam8bit",
        "AdamW8bit",
        "PagedAdamW",
    }
)

#: Names accepted for ``lr_scaling``; a callable ``ratio -> factor`` is accepted too.
LR_RULES = ("auto", "linear", "sqrt", "none")

LrRule = str | Callable[[float], float]


def rule_for(optimizer: Optimizer, rule: LrRule = "auto") -> LrRule:
    """The rule to apply to ``optimizer``: ``"auto"`` becomes ``"sqrt"`` for Adam-type ones.

    Example:
        >>> params = [torch.nn.Parameter(torch.zeros(1))]
        >>> rule_for(torch.optim.SGD(params, lr=0.1)), rule_for(torch.optim.AdamW(params))
        ('linear', 'sqrt')
        >>> rule_for(torch.optim.AdamW(params), "linear")
        'linear'
    """
    if rule != "auto":
        return rule
    names = {cls.__name__ for cls in type(optimizer).__mro__}
    return "sqrt" if names & ADAPTIVE_OPTIMIZERS else "linear"


def lr_factor(rule: LrRule, ratio: float) -> float:
    """The factor on the learning rate when the global batch grows by ``ratio``.

    ``rule``: ``"linear"`` (``ratio``), ``"sqrt"`` (``sqrt(ratio)``), ``"none"`` (1) or a
    callable ``ratio -> factor``.

    Example:
        >>> lr_factor("linear", 4.0), lr_factor("sqrt", 4.0), lr_factor("none", 4.0)
        (4.0, 2.0, 1.0)
        >>> lr_factor(lambda ratio: ratio ** 0.75, 16.0)
        8.0
    """
    if ratio <= 0 or not math.isfinite(ratio):
        raise ValueError(f"the batch-size ratio must be positive and finite, got {ratio}")
    if callable(rule):
        factor = float(rule(ratio))
        if factor <= 0 or not math.isfinite(factor):
            raise ValueError(f"the learning-rate rule returned {factor} for ratio {ratio}: give a factor > 0")
        return factor
    if rule == "linear":
        return float(ratio)
    if rule == "sqrt":
        return math.sqrt(ratio)
    if rule == "none":
        return 1.0
    raise ValueError(
        f"unknown learning-rate rule {rule!r}: use one of {LR_RULES} or a callable ratio -> factor"
    )


@dataclass(frozen=True)
class LinearWarmup:
    """Factor rising linearly from ``start_factor`` at step 0 to 1 at step ``steps`` (Goyal et al.).

    A plain function of the step, so it is also a ``LambdaLR`` ``lr_lambda``. With
    ``start_factor = 1 / k`` after a ``k``-fold learning-rate increase, training starts at
    the old learning rate and reaches the new one after ``steps`` optimizer steps.

    Example:
        >>> warmup = LinearWarmup(steps=4, start_factor=0.25)
        >>> [warmup(step) for step in range(6)]
        [0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0]
        >>> model = torch.nn.Linear(2, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
        >>> scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
        >>> optimizer.param_groups[0]["lr"]
        0.1
    """

    steps: int
    start_factor: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"warmup steps must be >= 0, got {self.steps}")
        if not 0.0 <= self.start_factor <= 1.0:
            raise ValueError(f"start_factor must lie in [0, 1], got {self.start_factor}")

    def __call__(self, step: int) -> float:
        if step >= self.steps:
            return 1.0
        if step <= 0:
            return self.start_factor
        return self.start_factor + (1.0 - self.start_factor) * step / self.steps


class WarmupOverlay:
    """Multiplies optimizers' learning rates by a warmup factor inside each ``optimizer.step()``.

    :meth:`attach` registers a step pre-hook that multiplies each param group's learning
    rate by ``warmups[i](step())`` and a post-hook that puts the kept value back. Outside
    ``optimizer.step()`` the rates are the unwarmed ones, so the user's schedulers (chainable
    ones such as ``StepLR`` included) compute from them and checkpoints hold them; the
    warmup stays a pure function of the step counter, which checkpoints restore.

    Example:
        >>> model = torch.nn.Linear(2, 2)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
        >>> steps = [0]
        >>> overlay = WarmupOverlay([LinearWarmup(steps=4, start_factor=0.25)], step=lambda: steps[0])
        >>> overlay.attach([optimizer])
        >>> used = []
        >>> def record(opt, args, kwargs):
        ...     used.append(round(opt.param_groups[0]["lr"], 6))
        >>> _ = optimizer.register_step_pre_hook(record)  # runs after the overlay's hook
        >>> for steps[0] in range(6):
        ...     model(torch.ones(1, 2)).sum().backward()
        ...     optimizer.step()
        >>> used, optimizer.param_groups[0]["lr"]
        ([0.1, 0.175, 0.25, 0.325, 0.4, 0.4], 0.4)
        >>> overlay.detach()
    """

    def __init__(self, warmups: Sequence[LinearWarmup], step: Callable[[], int]) -> None:
        self.warmups = tuple(warmups)
        self.step = step
        self._handles: list[Any] = []
        self._kept: dict[int, list[float]] = {}

    def attach(self, optimizers: Sequence[Optimizer]) -> None:
        """Warm ``optimizers[i]`` by ``warmups[i]`` (an optimizer without a warmup is left alone)."""
        self.detach()
        for optimizer, warmup in zip(optimizers, self.warmups, strict=False):
            self._handles.append(optimizer.register_step_pre_hook(self._pre_hook(warmup)))
            self._handles.append(optimizer.register_step_post_hook(self._post_hook))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre_hook(self, warmup: LinearWarmup) -> Callable[..., None]:
        def hook(optimizer: Optimizer, args: Any, kwargs: Any) -> None:
            factor = warmup(self.step())
            if factor == 1.0:
                return
            kept = []
            for group in optimizer.param_groups:
                kept.append(_read_lr(group))
                _write_lr(group, kept[-1] * factor)
            self._kept[id(optimizer)] = kept

        return hook

    def _post_hook(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        kept = self._kept.pop(id(optimizer), None)
        if kept is None:
            return
        for group, value in zip(optimizer.param_groups, kept, strict=False):
            _write_lr(group, value)


def _read_lr(group: dict) -> float:
    value = group["lr"]
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _write_lr(group: dict, value: float) -> None:
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value
