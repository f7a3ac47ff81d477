"""The device allocator as the session sees it: a cap set around training, and the peaks.

On CUDA the budget caps what the caching allocator may reserve
(``torch.cuda.set_per_process_memory_fraction``). The cap is set when a training step starts
and lifted, back to the fraction the user had before, when training pauses (validation,
testing, prediction with their own batch sizes) and when the session closes. The peaks the
session compares with the plan are the allocator's: allocated and *reserved* bytes. In a pass
the engine measures working memory in, it also reads the peak of allocated bytes at every change
of its ledger (:meth:`AllocatorControl.allocated_peak_reader`); those readings reset the
allocator's peak statistics, so the pass's peaks are kept apart for :meth:`AllocatorControl.peaks`.

Everything the session does to the allocator goes through :class:`AllocatorControl`, so tests
fake it on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
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

    def allocated_peak_reader(self) -> Callable[[], int] | None:
        """A function returning the peak of allocated bytes since its previous call (the first
        call: since the last :meth:`peaks` or :meth:`cap`), without disturbing :meth:`peaks`;
        ``None`` where the allocator cannot say (no working memory is measured then)."""
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

    def allocated_peak_reader(self) -> Callable[[], int] | None:
        return None


class CudaAllocatorControl:
    """The CUDA caching allocator of one device.

    Example:
        >>> control = CudaAllocatorControl(torch.device("cuda", 0))  # doctest: +SKIP
        >>> control.cap(8 * 2**30)  # doctest: +SKIP
        >>> control.lift()  # the user's own fraction is back  # doctest: +SKIP
        >>> read = control.allocated_peak_reader()  # doctest: +SKIP
        >>> read() <= control.peaks()[0]  # doctest: +SKIP
        True
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._total = torch.cuda.get_device_properties(device).total_memory
        self._previous: float | None = None  # the fraction before the cap; None while uncapped
        self._allocated_peak = 0  # the most any reading saw since the last peaks()
        self._reserved_peak = 0

    def cap(self, budget_bytes: int) -> None:
        if self._previous is None:
            self._previous = torch.cuda.get_per_process_memory_fraction(self.device)
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / self._total), self.device)
            torch.cuda.reset_peak_memory_stats(self.device)  # what came before training is not its
            self._allocated_peak = self._reserved_peak = 0

    def lift(self) -> None:
        if self._previous is not None:
            torch.cuda.set_per_process_memory_fraction(self._previous, self.device)
            self._previous = None

    def peaks(self) -> tuple[int, int] | None:
        allocated, reserved = self._read_and_reset()
        peaks = max(allocated, self._allocated_peak), max(reserved, self._reserved_peak)
        self._allocated_peak = self._reserved_peak = 0
        return peaks

    def allocated_peak_reader(self) -> Callable[[], int] | None:
        return self._read_allocated_peak

    def _read_allocated_peak(self) -> int:
        allocated, reserved = self._read_and_reset()
        self._allocated_peak = max(self._allocated_peak, allocated)
        self._reserved_peak = max(self._reserved_peak, reserved)
        return allocated

    def _read_and_reset(self) -> tuple[int, int]:
        """The allocator's peaks of allocated and reserved bytes since its last reset; reset now.
        One call to its statistics (``max_memory_allocated`` and ``max_memory_reserved`` each
        build them all)."""
        stats = torch.cuda.memory_stats_as_nested_dict(self.device)  # empty before CUDA is used
        torch.cuda.reset_peak_memory_stats(self.device)
        allocated = stats.get("allocated_bytes", {}).get("all", {}).get("peak", 0)
        reserved = stats.get("reserved_bytes", {}).get("all", {}).get("peak", 0)
        return int(allocated), int(reserved)


def allocator_control_for(device: torch.device) -> AllocatorControl:
    """The control for ``device``: CUDA's caching allocator, or none on CPU.

    Example:
        >>> type(allocator_control_for(torch.device("cpu"))).__name__
        'NoAllocatorControl'
    """
    if device.type == "cuda":
        return CudaAllocatorControl(device)
    return NoAllocatorControl()
