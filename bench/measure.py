"""Clocks and memory meters shared by every strategy of a run.

On CUDA a step's peak is the caching allocator's ``max_memory_allocated`` and
``max_memory_reserved`` (reset at each step's start). On CPU there is no device memory:
the meter reports the process's peak resident set (Linux ``VmHWM``, reset per step through
``/proc/self/clear_refs``) less the resident set before the run built its model, and says
so in ``peak_source``.

Example:
    >>> meter = MemoryMeter(torch.device("cpu"))
    >>> meter.start_run(); meter.start_step()
    >>> _ = torch.ones(1000)
    >>> meter.end_step().allocated >= 0
    True
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass

import torch

PEAK_CUDA = "cuda_allocator"
PEAK_RSS = "process_rss_delta"
PEAK_LEDGER = "engine_ledger"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    """Wall-clock seconds after the device has finished what was queued.

    Example:
        >>> now(torch.device("cpu")) > 0
        True
    """
    synchronize(device)
    return time.perf_counter()


def median(values: list[float]) -> float | None:
    """The median, or ``None`` for no values.

    Example:
        >>> median([3.0, 1.0, 2.0]), median([])
        (2.0, None)
    """
    return statistics.median(values) if values else None


def release_memory(device: torch.device) -> None:
    """Collect garbage and give cached device memory back between runs."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class StepMemory:
    """One step's peaks in bytes: ``allocated`` and ``reserved`` (``None`` where not measured)."""

    allocated: int
    reserved: int | None


def _read_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


#: The CUDA caching allocator's counters read around a step: a step that frees its cache and
#: retries under the cap, or calls ``cudaMalloc``/``cudaFree``, synchronises the device.
ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def allocator_counters(device: torch.device) -> dict[str, int]:
    """The allocator's :data:`ALLOCATOR_COUNTERS` now (empty off CUDA).

    Example:
        >>> allocator_counters(torch.device("cpu"))
        {}
    """
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {name: int(stats.get(name, 0)) for name in ALLOCATOR_COUNTERS}


def counter_increase(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Each counter's increase from ``before`` to ``after``.

    Example:
        >>> counter_increase({"num_device_alloc": 3}, {"num_device_alloc": 5})
        {'num_device_alloc': 2}
    """
    return {name: after[name] - before[name] for name in after}


class MemoryMeter:
    """Peak memory of each step of one run, on CUDA (allocator) or CPU (resident set delta).

    ``extra_peak`` passed to :meth:`end_step` folds in a peak measured inside the step by
    someone who reset the allocator's statistics in between (AccUDNN's session does, at
    the end of backward).

    Example:
        >>> meter = MemoryMeter(torch.device("cpu"))
        >>> meter.peak_source
        'process_rss_delta'
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0
        self.rss_peak_resettable = True

    @property
    def peak_source(self) -> str:
        return PEAK_CUDA if self.device.type == "cuda" else PEAK_RSS

    def start_run(self) -> None:
        """Take the baseline before the run builds its model."""
        release_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.baseline = _read_status_kb("VmRSS") or 0

    def start_step(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.rss_peak_resettable = _reset_rss_peak() and self.rss_peak_resettable

    def end_step(self, extra_peak: StepMemory | None = None) -> StepMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            allocated = torch.cuda.max_memory_allocated(self.device)
            reserved: int | None = torch.cuda.max_memory_reserved(self.device)
        else:
            allocated = max(0, (_read_status_kb("VmHWM") or 0) - self.baseline)
            reserved = None
        if extra_peak is not None:
            allocated = max(allocated, extra_peak.allocated)
            if reserved is not None and extra_peak.reserved is not None:
                reserved = max(reserved, extra_peak.reserved)
        return StepMemory(allocated, reserved)
