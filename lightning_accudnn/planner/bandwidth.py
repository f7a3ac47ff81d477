"""Host-link bandwidth: measured with pinned copies, cross-checked with the PCIe link.

Measured once per device and cached for the process. On CPU the "link" is a memory copy,
which is what the host-copy backend does.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

#: Usable bytes/s per lane after line encoding, by PCIe generation.
PCIE_BYTES_PER_LANE = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
_PROBE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class HostLink:
    """Bytes per second device-to-host and host-to-device, and the PCIe link if known.

    Example:
        >>> link = host_link(torch.device("cpu"))
        >>> link.d2h_bytes_per_second > 0
        True
    """

    d2h_bytes_per_second: float
    h2d_bytes_per_second: float
    pcie_generation: int | None = None
    pcie_width: int | None = None

    @property
    def pcie_bytes_per_second(self) -> float | None:
        """Theoretical one-way bandwidth of the PCIe link, or ``None`` if unknown."""
        if self.pcie_generation is None or self.pcie_width is None:
            return None
        return PCIE_BYTES_PER_LANE.get(self.pcie_generation, 0.0) * self.pcie_width or None


def _cache_key(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return (device.type, 0)


def host_link(device: torch.device) -> HostLink:
    """The measured host link of ``device`` (cached per device)."""
    return _measure(*_cache_key(device))


@functools.cache
def _measure(kind: str, index: int) -> HostLink:
    if kind != "cuda":
        rate = _cpu_copy_rate()
        return HostLink(rate, rate)
    device = torch.device("cuda", index)
    host = torch.empty(_PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(_PROBE_BYTES, dtype=torch.uint8, device=device)
    d2h = _cuda_copy_rate(lambda: host.copy_(on_device, non_blocking=True), device)
    h2d = _cuda_copy_rate(lambda: on_device.copy_(host, non_blocking=True), device)
    generation, width = _pcie_link(index)
    link = HostLink(d2h, h2d, generation, width)
    _cross_check(link, torch.cuda.get_device_name(device))
    return link


def _cuda_copy_rate(copy: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    best = float("inf")
    with torch.cuda.stream(stream):
        copy()  # warm-up
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record(stream)
            copy()
            end.record(stream)
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1000.0)
    return _PROBE_BYTES / best


def _cpu_copy_rate(repeats: int = 3) -> float:
    source = torch.ones(_PROBE_BYTES, dtype=torch.uint8)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return _PROBE_BYTES / max(best, 1e-9)


def _pcie_link(index: int) -> tuple[int | None, int | None]:
    """PCIe generation and width from NVML (package ``nvidia-ml-py``), or ``(None, None)``.

    The maximum the GPU and system support, not the current link: an idle GPU trains its
    link down to save power, so the current figures read low outside a copy.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return (
                pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
            )
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # NVML missing or not permitted: the measurement stands alone
        log.info("PCIe link unknown (%s); using the measured bandwidth only", error)
        return None, None


def _cross_check(link: HostLink, device_name: str) -> None:
    theoretical = link.pcie_bytes_per_second
    if theoretical is None:
        return
    slowest = min(link.d2h_bytes_per_second, link.h2d_bytes_per_second)
    if slowest < 0.5 * theoretical:
        warnings.warn(
            f"{device_name}: pinned host copies reach {slowest / 1e9:.1f} GB/s, under half of what its "
            f"PCIe Gen{link.pcie_generation} x{link.pcie_width} link carries ({theoretical / 1e9:.1f} GB/s). "
            "Another process may share the link, or the GPU sits in a slower slot; "
            "plans use the measured figure.",
            stacklevel=3,
        )
