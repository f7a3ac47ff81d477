"""The device allocator as the session sees it: a cap set around training, and the peaks.

On CUDA the budget caps what the caching allocator may reserve
(``torch.cuda.set_per_process_memory_fraction``). The cap is set when a training step starts
and lifted, back to the fraction the user had before, when training pauses (validation,
testing, prediction with their own batch sizes) and when the session closes. The peaks the
session compares with the plan are the allocator's: allocated and *reserved* bytes.

Everything the session does to the allocator goes through :class:`AllocatorControl`, so tests
fake it on machines without a GPU.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["AllocatorControl", "CudaAllocatorControl", "NoAllocatorControl", "allocator_control_for"]


class AllocatorControl(Protocol):
    """What the session needs from a device allocator."""

    def cap(self, budget_bytes: int) -> None:
        """Cap what may be reserved at ``budget_bytes`` (idempotent)."""
        ...

    def lift(self) -> None:
        """Lift the cap: the fraction in force before the first :meth:`cap` is back (idempotent)."""
        ...

    def peaks(self) -> tuple[int, int] | None:
        """(peak allocated, peak reserved) bytes since the last call, or ``None`` without an allocator."""
        ...


class NoAllocatorControl:
    """The CPU: no allocator to cap, no peaks (the engine's ledger stands in).

    Example:
        >>> control = NoAllocatorControl()
        >>> control.cap(10); control.lift(); control.peaks() is None
        True
    """

    def cap(self, budget_bytes: int) -> None:
        pass

    def lift(self) -> None:
        pass

    def peaks(self) -> tuple[int, int] | None:
        return None


class CudaAllocatorControl:
    """The CUDA caching allocator of one device.

    Example:
        >>> control = CudaAllocatorControl(torch.device("cuda", 0))  # doctest: +SKIP
        >>> control.cap(8 * 2**30)  # doctest: +SKIP
        >>> control.lift()  # the user's own fraction is back  # doctest: +SKIP
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._total = torch.cuda.get_device_properties(device).total_memory
        self._previous: float | None = None  # the fraction before the cap; None while uncapped

    def cap(self, budget_bytes: int) -> None:
        if self._previous is None:
            self._previous = torch.cuda.get_per_process_memory_fraction(self.device)
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / self._total), self.device)

    def lift(self) -> None:
        if self._previous is not None:
            torch.cuda.set_per_process_memory_fraction(self._previous, self.device)
            self._previous = None

    def peaks(self) -> tuple[int, int] | None:
        allocated = torch.cuda.max_memory_allocated(self.device)
        reserved = torch.cuda.max_memory_reserved(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return allocated, reserved


def allocator_control_for(device: torch.device) -> AllocatorControl:
    """The control for ``device``: CUDA's caching allocator, or none on CPU.

    Example:
        >>> type(allocator_control_for(torch.device("cpu"))).__name__
        'NoAllocatorControl'
    """
    if device.type == "cuda":
        return CudaAllocatorControl(device)
    return NoAllocatorControl()
