"""Compute waits on a group of copies once: the records of a group share its event, and a wait on
the event that compute waited on last orders nothing more (on a GPU host each wait is a CUDA
call). The simulated GPU's checker still sees every read of a copy brought back ordered after
the copy, and every free of a swapped block after its copy out."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.testing import SimulatedGPU


class WaitRecordingGPU(SimulatedGPU):
    """A simulated GPU that keeps every event compute is made to wait on, in order."""

    def __init__(self, lag: int | None) -> None:
        super().__init__(lag=lag, seed=1)
        self.waited: list[object] = []

    def wait(self, event):
        self.waited.append(event)
        super().wait(event)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU()) for _ in range(6)))


def _backward(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("lag", [0, 3, None])
def test_compute_never_waits_again_on_the_event_it_waited_on_last(lag):
    plain = _model()
    model = copy.deepcopy(plain)
    x = torch.randn(8, 16)
    expected = _backward(plain, x)
    runtime = WaitRecordingGPU(lag)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = model(x).square().sum()
    loss.backward()
    profiled = engine.end_step()
    assert profiled is not None
    # Every copy out retired at once (so that backward copies in), prefetched in groups of several.
    schedule = SwapSchedule.swap_everything(2**20, max_copying_out_bytes=0)
    for _ in range(2):
        runtime.waited.clear()
        model.zero_grad(set_to_none=True)
        with engine.offload(model, schedule, sequence=profiled.sequence):
            loss = model(x).square().sum()
        loss.backward()
        stats = engine.end_step()
        assert stats is not None and stats.storages_swapped_out > 0 and stats.bytes_swapped_in > 0
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected, strict=True))
        waited = runtime.waited
        repeated = [i for i in range(1, len(waited)) if waited[i] is waited[i - 1]]
        assert not repeated, f"compute waited again on the event it waited on last, at waits {repeated}"
        # One wait per group of copies or fewer: far fewer than the records read back.
        assert len(waited) < stats.storages_swapped_out
    engine.close()
    assert runtime.violations == []
