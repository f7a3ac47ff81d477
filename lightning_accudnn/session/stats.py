"""What one training pass measured, against what its plan predicted."""

from __future__ import annotations

import dataclasses

__all__ = ["OffloadStats"]


@dataclasses.dataclass(frozen=True)
class OffloadStats:
    """Figures of the last training pass (forward and backward), kept as ``session.stats``.

    ``peak_device_bytes`` is ``torch.cuda.max_memory_allocated`` on CUDA and the engine's
    ledger (model state plus saved activations) on CPU; ``peak_reserved_bytes`` is the
    caching allocator's reserve on CUDA and equals the ledger on CPU. ``step_seconds`` is
    the measured forward plus backward time (CUDA events on GPU, wall clock on CPU); the
    ``predicted_*`` figures are the plan's for this step (``None`` in a profiling step)
    and the ``*_error`` figures are measured over predicted, less one.

    Example:
        >>> stats = OffloadStats(100, 100, 0.001, 900, 900, 900, 1, False, 0.01, 1_000, 0.008)
        >>> round(stats.peak_error, 2), round(stats.step_time_error, 2)
        (-0.1, 0.25)
        >>> stats.as_metrics()["accudnn/bytes_swapped_out"]
        100.0
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
        """The figures as ``accudnn/*`` metrics for a logger (those that exist)."""
        names = (
            "bytes_swapped_out",
            "bytes_swapped_in",
            "wait_seconds",
            "peak_device_bytes",
            "peak_reserved_bytes",
            "step_seconds",
            "peak_error",
            "step_time_error",
        )
        values = {name: getattr(self, name) for name in names}
        return {f"accudnn/{name}": float(value) for name, value in values.items() if value is not None}
