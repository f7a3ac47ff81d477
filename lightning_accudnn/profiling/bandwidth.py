"""Host-link bandwidth: measured with pinned copies at the sizes the plan moves, cross-checked with NVML.

A copy's rate depends on its size (a fixed cost per copy, then the link's rate), so one
64 MiB copy overstates what the engine's typical transfers reach. The probe
(:func:`probe_host_link`) times copies at a ladder of sizes (:data:`PROBE_SIZES`) once per
device and process, and :meth:`LinkCurve.link_for` turns that curve into the rates of the
transfers a profile makes: total bytes over the summed predicted time of each transfer.
The probe allocates its device buffer and frees it before returning, so it belongs **before
the allocator cap is set** (the session calls it at setup); later calls read the cache.

The PCIe link is read from NVML by the device's **PCI bus id**, which names the right GPU
under ``CUDA_VISIBLE_DEVICES`` (CUDA and NVML number devices differently) and under MIG (the
link is the parent GPU's). On CPU the "link" is a memory copy, which is what the host-copy
backend does.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

log = logging.getLogger(__name__)

__all__ = [
    "PCIE_BYTES_PER_LANE",
    "PROBE_SIZES",
    "CopyTimer",
    "HostLink",
    "LinkCurve",
    "host_link",
    "measure_link_curve",
    "pci_bus_id",
    "pcie_link",
    "probe_host_link",
]

#: Usable bytes/s per lane after line encoding, by PCIe generation.
PCIE_BYTES_PER_LANE = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
#: Copy sizes the probe times: from the engine's default ``min_swap_bytes`` (1 MiB) down to a
#: quarter of it and up to 64 MiB, a factor of 4 apart.
PROBE_SIZES = (2**18, 2**20, 2**22, 2**24, 2**26)

Direction = Literal["d2h", "h2d"]
#: Seconds one copy of ``nbytes`` takes in a direction (the best of a few, after a warm-up).
CopyTimer = Callable[[Direction, int], float]


@dataclass(frozen=True)
class HostLink:
    """Bytes per second device-to-host and host-to-device, and the PCIe link if known.

    Example:
        >>> link = HostLink(20e9, 25e9, pcie_generation=4, pcie_width=16)
        >>> round(link.pcie_bytes_per_second / 1e9, 1)
        31.5
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


@dataclass(frozen=True)
class LinkCurve:
    """Measured copy times at a few sizes, both ways; predicts any size by interpolation.

    Between two probed sizes a copy's time is interpolated linearly in the size (a fixed cost
    plus a rate, fitted per interval); below the smallest probe the time of the smallest is
    taken (never less), above the largest the largest probe's rate is extrapolated.

    Example:
        >>> curve = LinkCurve((100, 1_000), d2h_seconds=(2.0, 11.0), h2d_seconds=(1.0, 10.0))
        >>> curve.seconds("d2h", 550), curve.seconds("h2d", 2_000), curve.seconds("d2h", 10)
        (6.5, 20.0, 2.0)
        >>> link = curve.link_for([100, 1_000])  # 1100 bytes in 13 s and in 11 s
        >>> round(link.d2h_bytes_per_second, 3), link.h2d_bytes_per_second
        (84.615, 100.0)
    """

    sizes: tuple[int, ...]
    d2h_seconds: tuple[float, ...]
    h2d_seconds: tuple[float, ...]
    pcie_generation: int | None = None
    pcie_width: int | None = None

    def __post_init__(self) -> None:
        if not self.sizes or list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] <= 0:
            raise ValueError(f"LinkCurve.sizes must be increasing positive sizes, got {self.sizes}")
        for name, seconds in (("d2h_seconds", self.d2h_seconds), ("h2d_seconds", self.h2d_seconds)):
            if len(seconds) != len(self.sizes) or not all(s > 0 and math.isfinite(s) for s in seconds):
                raise ValueError(f"LinkCurve.{name} must hold one finite time > 0 per size, got {seconds}")

    def seconds(self, direction: Direction, nbytes: int) -> float:
        """Predicted seconds of one copy of ``nbytes``."""
        times = self.d2h_seconds if direction == "d2h" else self.h2d_seconds
        sizes = self.sizes
        if nbytes <= sizes[0]:
            return times[0]
        if nbytes >= sizes[-1]:
            return times[-1] * nbytes / sizes[-1]
        upper = bisect.bisect_left(sizes, nbytes)
        lower = upper - 1
        share = (nbytes - sizes[lower]) / (sizes[upper] - sizes[lower])
        return times[lower] + share * (times[upper] - times[lower])

    def link_for(self, transfer_sizes: Sequence[int] = ()) -> HostLink:
        """The rates a step moving ``transfer_sizes`` (one entry per copy) reaches: their bytes
        over their summed predicted times. Without sizes: the largest probe's rates."""
        sizes = [size for size in transfer_sizes if size > 0] or [self.sizes[-1]]
        total = sum(sizes)
        return HostLink(
            total / sum(self.seconds("d2h", size) for size in sizes),
            total / sum(self.seconds("h2d", size) for size in sizes),
            self.pcie_generation,
            self.pcie_width,
        )


def measure_link_curve(timer: CopyTimer, sizes: Sequence[int] = PROBE_SIZES) -> LinkCurve:
    """Time one copy each way at every size with ``timer`` (see :data:`CopyTimer`).

    Example:
        >>> fake = lambda direction, nbytes: 1e-5 + nbytes / (10e9 if direction == "d2h" else 20e9)
        >>> curve = measure_link_curve(fake, sizes=(2**20, 2**26))
        >>> round(curve.link_for([2**20]).d2h_bytes_per_second / 1e9, 2)  # the fixed cost shows
        9.13
    """
    ordered = tuple(sorted(set(sizes)))
    return LinkCurve(
        ordered,
        tuple(timer("d2h", size) for size in ordered),
        tuple(timer("h2d", size) for size in ordered),
    )


_curves: dict[tuple[str, int], LinkCurve] = {}


def _cache_key(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return (device.type, 0)


def probe_host_link(device: torch.device, timer: CopyTimer | None = None) -> LinkCurve:
    """The link curve of ``device``: measured on the first call, cached for the process.

    Call it **before the allocator cap is set** (at setup): on CUDA it allocates a device
    buffer of the largest probe size (64 MiB) and frees it before returning. ``timer`` replaces
    the copies (tests); the PCIe link comes from NVML by PCI bus id (:func:`pcie_link`).

    Example:
        >>> curve = probe_host_link(torch.device("cpu"))
        >>> curve.sizes == PROBE_SIZES and curve.link_for().d2h_bytes_per_second > 0
        True
    """
    key = _cache_key(device)
    cached = _curves.get(key)
    if cached is not None:
        return cached
    if key[0] != "cuda":
        curve = measure_link_curve(timer or _cpu_copy_timer())
    else:
        index = key[1]
        curve = measure_link_curve(timer or _cuda_copy_timer(torch.device("cuda", index)))
        bus_id = pci_bus_id(index)
        generation, width = pcie_link(bus_id) if bus_id is not None else (None, None)
        curve = LinkCurve(curve.sizes, curve.d2h_seconds, curve.h2d_seconds, generation, width)
        _cross_check(curve.link_for(), torch.cuda.get_device_name(index))
        torch.cuda.empty_cache()  # the probe's buffers go back before any cap is set
    _curves[key] = curve
    return curve


def host_link(device: torch.device, transfer_sizes: Sequence[int] = ()) -> HostLink:
    """The host link of ``device`` for copies of ``transfer_sizes`` (the storages a plan moves);
    without sizes, the rates of 64 MiB copies. Probes on first use (:func:`probe_host_link`).

    Example:
        >>> link = host_link(torch.device("cpu"), transfer_sizes=[2**20, 2**22])
        >>> link.d2h_bytes_per_second > 0
        True
    """
    return probe_host_link(device).link_for(transfer_sizes)


def _best_of(copy: Callable[[], float], repeats: int = 3) -> float:
    copy()  # warm-up
    return min(copy() for _ in range(repeats))


def _cpu_copy_timer() -> CopyTimer:
    source = torch.ones(max(PROBE_SIZES), dtype=torch.uint8)
    target = torch.empty_like(source)

    def timer(direction: Direction, nbytes: int) -> float:
        del direction  # a memory copy either way
        src, dst = source[:nbytes], target[:nbytes]

        def copy() -> float:
            start = time.perf_counter()
            dst.copy_(src)
            return max(time.perf_counter() - start, 1e-9)

        return _best_of(copy)

    return timer


def _cuda_copy_timer(device: torch.device) -> CopyTimer:  # pragma: no cover - needs a GPU
    host = torch.empty(max(PROBE_SIZES), dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(max(PROBE_SIZES), dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    # The buffers were allocated in the compute stream's order: the probe's stream comes after
    # (the CUDA sanitizer on an H100 reported the first copy racing the allocation).
    stream.wait_stream(torch.cuda.current_stream(device))

    def timer(direction: Direction, nbytes: int) -> float:
        src, dst = (on_device, host) if direction == "d2h" else (host, on_device)
        src, dst = src[:nbytes], dst[:nbytes]

        def copy() -> float:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            with torch.cuda.stream(stream):
                start.record(stream)
                dst.copy_(src, non_blocking=True)
                end.record(stream)
            end.synchronize()
            return max(float(start.elapsed_time(end)) / 1000.0, 1e-9)

        return _best_of(copy)

    return timer


def pci_bus_id(index: int) -> str | None:
    """The PCI bus id of CUDA device ``index`` in NVML's form (``"00000000:3B:00.0"``), or
    ``None`` when this torch does not report it.

    CUDA numbers devices after ``CUDA_VISIBLE_DEVICES`` (and, by default, fastest first);
    NVML numbers every GPU of the machine in PCI order: the bus id names the same GPU in both.
    """
    properties = torch.cuda.get_device_properties(index)
    domain, bus, device = (
        getattr(properties, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")
    )
    if not (isinstance(domain, int) and isinstance(bus, int) and isinstance(device, int)):
        return None
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def pcie_link(bus_id: str) -> tuple[int | None, int | None]:
    """PCIe generation and width of the GPU at ``bus_id``, from NVML (package ``nvidia-ml-py``),
    or ``(None, None)`` when NVML is missing or refuses.

    The maximum the GPU and system support, not the current link: an idle GPU trains its
    link down to save power, so the current figures read low outside a copy. A MIG instance
    shares its parent GPU's bus id, so this is the parent's link, which its copies use.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            return (
                int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
            )
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # NVML missing or not permitted: the measurement stands alone
        log.info("PCIe link of %s unknown (%s); using the measured bandwidth only", bus_id, error)
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
