"""The link probe: NVML by PCI bus id, rates at the sizes the plan moves (no GPU needed)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.profiling import bandwidth
from lightning_accudnn.profiling.bandwidth import (
    PROBE_SIZES,
    LinkCurve,
    host_link,
    measure_link_curve,
    pcie_link,
    probe_host_link,
)

_FIXED = 20e-6  # seconds per copy, whatever its size


def _timer(calls: list[tuple[str, int]], d2h: float = 20e9, h2d: float = 25e9):
    def timer(direction: str, nbytes: int) -> float:
        calls.append((direction, nbytes))
        return _FIXED + nbytes / (d2h if direction == "d2h" else h2d)

    return timer


def _fake_nvml(links: dict[str, tuple[int, int]], asked: list[str]) -> types.ModuleType:
    """An NVML that knows GPUs only by PCI bus id (no lookup by index at all)."""
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None

    def by_bus_id(bus_id: str) -> str:
        asked.append(bus_id)
        if bus_id not in links:
            raise RuntimeError(f"NVML_ERROR_NOT_FOUND: {bus_id}")
        return bus_id

    module.nvmlDeviceGetHandleByPciBusId = by_bus_id
    module.nvmlDeviceGetMaxPcieLinkGeneration = lambda handle: links[handle][0]
    module.nvmlDeviceGetMaxPcieLinkWidth = lambda handle: links[handle][1]
    return module


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA device 0 (the second physical GPU under CUDA_VISIBLE_DEVICES=1) at bus 0000:3B:00.0."""
    monkeypatch.setattr(bandwidth, "_curves", {})
    properties = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")


def test_nvml_is_opened_by_the_pci_bus_id_of_the_cuda_device(monkeypatch, fake_cuda):
    asked: list[str] = []
    # NVML index 0 is another GPU (Gen3 x8); ours, at 3B, is Gen4 x16.
    links = {"00000000:1A:00.0": (3, 8), "00000000:3B:00.0": (4, 16)}
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(links, asked))
    calls: list[tuple[str, int]] = []
    curve = probe_host_link(torch.device("cuda", 0), timer=_timer(calls))
    assert asked == ["00000000:3B:00.0"]
    assert (curve.pcie_generation, curve.pcie_width) == (4, 16)
    assert round(curve.link_for().pcie_bytes_per_second / 1e9, 1) == 31.5


def test_nvml_missing_or_refusing_leaves_the_measurement(monkeypatch, fake_cuda):
    asked: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({}, asked))  # bus id unknown to NVML
    curve = probe_host_link(torch.device("cuda", 0), timer=_timer([]))
    assert asked == ["00000000:3B:00.0"]
    assert (curve.pcie_generation, curve.pcie_width) == (None, None)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert pcie_link("00000000:3B:00.0") == (None, None)


def test_a_link_far_below_its_pcie_figure_is_reported(monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({"00000000:3B:00.0": (5, 16)}, []))
    with pytest.warns(UserWarning, match="under half of what its PCIe Gen5 x16 link carries"):
        probe_host_link(torch.device("cuda", 0), timer=_timer([], d2h=10e9, h2d=10e9))


def test_the_probe_measures_each_size_once_each_way_and_is_cached(monkeypatch, fake_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    calls: list[tuple[str, int]] = []
    first = probe_host_link(torch.device("cuda", 0), timer=_timer(calls))
    assert sorted(calls) == sorted([(d, size) for d in ("d2h", "h2d") for size in PROBE_SIZES])
    assert probe_host_link(torch.device("cuda", 0), timer=_timer(calls)) is first
    assert len(calls) == 2 * len(PROBE_SIZES)
    assert host_link(torch.device("cuda", 0)) == first.link_for()


def test_the_rate_is_the_one_of_the_transfers_the_plan_makes(monkeypatch, fake_cuda):
    """A fixed cost per copy makes small copies slower: the rate for 1 MiB storages is well below
    the 64 MiB figure, which is what a single large probe would have reported."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    curve = probe_host_link(torch.device("cuda", 0), timer=_timer([]))
    large = curve.link_for()
    small = host_link(torch.device("cuda", 0), transfer_sizes=[2**20] * 100)
    expected = 2**20 / (_FIXED + 2**20 / 20e9)
    assert small.d2h_bytes_per_second == pytest.approx(expected, rel=1e-9)
    assert small.d2h_bytes_per_second < 0.75 * large.d2h_bytes_per_second
    mixed = curve.link_for([2**20, 2**26])
    assert small.d2h_bytes_per_second < mixed.d2h_bytes_per_second < large.d2h_bytes_per_second


@settings(max_examples=100, deadline=None)
@given(
    st.floats(0.0, 1e-4),
    st.floats(1e9, 1e11),
    st.lists(st.integers(1, 2**28), min_size=1, max_size=20),
)
def test_interpolation_is_exact_for_a_fixed_cost_and_a_rate(fixed, rate, transfers):
    """Copy time = fixed + bytes / rate is linear in the size, so the curve reproduces it between
    the probes, never under-counts below the smallest, and extrapolates the rate above the largest."""

    def timer(direction: str, nbytes: int) -> float:
        return fixed + nbytes / rate

    curve = measure_link_curve(timer)
    for size in transfers:
        predicted = curve.seconds("d2h", size)
        if PROBE_SIZES[0] <= size <= PROBE_SIZES[-1]:
            assert predicted == pytest.approx(timer("d2h", size), rel=1e-9)
        else:
            assert predicted >= min(timer("d2h", size), timer("d2h", PROBE_SIZES[0])) * (1 - 1e-12)
    link = curve.link_for(transfers)
    expected = sum(transfers) / sum(curve.seconds("h2d", size) for size in transfers)
    assert link.h2d_bytes_per_second == pytest.approx(expected)


def test_a_curve_refuses_bad_figures():
    with pytest.raises(ValueError, match="increasing positive sizes"):
        LinkCurve((2, 1), (1.0, 1.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="one finite time > 0 per size"):
        LinkCurve((1, 2), (1.0, 0.0), (1.0, 1.0))


def test_on_cpu_the_probe_times_memory_copies():
    link = host_link(torch.device("cpu"), transfer_sizes=[2**20])
    assert link.d2h_bytes_per_second > 0 and link.pcie_generation is None
