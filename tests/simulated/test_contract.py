"""The engine side of the memory contract, figure by figure, on a simulated GPU."""

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.testing import SimulatedGPU

WIDTH, BATCH = 64, 16
STORAGE = WIDTH * BATCH * 4  # every saved storage of the chain below


def _chain(depth: int = 8) -> nn.Module:
    """Linear-Tanh pairs: each Tanh output is saved by Tanh and the next Linear (one storage)."""
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(WIDTH, WIDTH, bias=False), nn.Tanh()]
    return nn.Sequential(*layers)


@pytest.mark.parametrize("lag", [0, 3, None])
@pytest.mark.parametrize("in_flight", [0, 2])
def test_forward_holds_the_fifo_limit_plus_the_storage_being_pushed(lag, in_flight):
    model = _chain()
    gpu = SimulatedGPU(lag=lag)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
    schedule = SwapSchedule.swap_everything(0, max_copying_out_bytes=in_flight * STORAGE)
    with engine.offload(model, schedule):
        loss = model(torch.randn(BATCH, WIDTH)).sum()
    # After each push the oldest go while more than the limit (and more than one) is in flight.
    assert engine.ledger.peak_bytes == (max(in_flight, 1) + 1) * STORAGE
    assert gpu.peak_held_bytes == engine.ledger.peak_bytes
    loss.backward()
    engine.end_step()
    assert gpu.violations == []


@pytest.mark.parametrize("lag", [0, None])
def test_no_limit_keeps_every_swapped_storage_until_backward(lag):
    model = _chain(depth=4)
    gpu = SimulatedGPU(lag=lag)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
    with engine.offload(model, SwapSchedule.swap_everything(0)):
        loss = model(torch.randn(BATCH, WIDTH)).sum()
    assert engine.ledger.peak_bytes == 5 * STORAGE  # the input and four Tanh outputs
    loss.backward()
    stats = engine.end_step()
    assert stats.bytes_swapped_in == 0  # all read in place: nothing had left the device
    assert gpu.violations == []


def test_copies_back_are_allocated_on_the_compute_stream_and_bounded_by_the_window():
    model = _chain()
    peaks = []
    windows = (0, 4 * STORAGE, 8 * STORAGE)
    for window in windows:
        gpu = SimulatedGPU(lag=None)
        engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
        with engine.offload(model, SwapSchedule.swap_everything(window, max_copying_out_bytes=0)):
            loss = model(torch.randn(BATCH, WIDTH)).sum()
        loss.backward()
        peaks.append(engine.end_step().ledger_peak_bytes)
        assert gpu.violations == []
        assert gpu.allocator.streams == {"compute"}
    assert peaks[0] < peaks[1] < peaks[2], peaks
    # In backward: the copies in the window (one always allowed) plus the one being read.
    for window, peak in zip(windows, peaks, strict=True):
        assert peak <= max(window, STORAGE) + STORAGE, (window, peak)
