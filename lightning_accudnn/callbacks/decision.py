"""What the tuner decided, as plain data that goes into checkpoints."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TunerDecision"]


@dataclass
class TunerDecision:
    """The batch size and learning-rate change an :class:`~.EfficiencyTuner` chose.

    ``batch_size`` is per device; the global batch multiplies it by ``world_size`` and
    ``accumulate_grad_batches``. ``lr_factors[i]`` multiplies optimizer ``i``'s learning
    rates (and its schedule); ``learning_rates[i]`` are its param groups' rates right after
    scaling. ``step_ratio`` is the run's optimizer steps after over before the change
    (step-counted schedules were stretched by it). Warmup runs ``warmup_steps`` optimizer
    steps from ``warmup_start_step`` at factors rising from ``warmup_start_factors[i]``.

    Example:
        >>> decision = TunerDecision(batch_size=64, start_batch_size=16, base_global_batch_size=16)
        >>> decision.global_batch_size, decision.batch_ratio
        (64, 4.0)
        >>> TunerDecision.from_dict(decision.to_dict()) == decision
        True
    """

    batch_size: int
    start_batch_size: int
    base_global_batch_size: int
    world_size: int = 1
    accumulate_grad_batches: int = 1
    lr_rules: list[str] = field(default_factory=list)
    lr_factors: list[float] = field(default_factory=list)
    learning_rates: list[list[float]] = field(default_factory=list)
    step_ratio: float = 1.0
    warmup_steps: int = 0
    warmup_start_factors: list[float] = field(default_factory=list)
    warmup_start_step: int | None = None
    samples_per_second: float | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size * self.accumulate_grad_batches

    @property
    def batch_ratio(self) -> float:
        """The global batch over the base one the learning rate was set for."""
        return self.global_batch_size / self.base_global_batch_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> TunerDecision:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in state.items() if key in known})
