"""Events reused as on a GPU: the engine on the simulated GPU, whose compute event is recorded
again for each group of copies and whose copy-stream events come from a ring, at lags 0, 3, 8
and unbounded: gradients bitwise equal, no race, no wait on an event recorded again since its
group, and no event made once the passes repeat. Copies out of small storages go in groups
that span layers."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.ops.engine import COPY_GROUP_STORAGES
from lightning_accudnn.testing import SimulatedGPU

LAGS = [0, 3, 8, None]
SCHEDULES = {
    "one in flight, no window": SwapSchedule.swap_everything(0, max_copying_out_bytes=0),
    "one layer in flight, a layer's window": SwapSchedule.swap_everything(1100, max_copying_out_bytes=1100),
    "nothing retired before backward, a wide window": SwapSchedule.swap_everything(2**20),
}


class CopyCountingGPU(SimulatedGPU):
    def __init__(self, lag):
        super().__init__(lag=lag, seed=3)
        self.copies_out = 0

    def copy_out(self, after, sources, hosts):
        self.copies_out += 1
        return super().copy_out(after, sources, hosts)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.ReLU()) for _ in range(12)))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("lag", LAGS)
@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
def test_reused_events_order_every_copy_and_none_is_made_in_the_steady_state(lag, schedule_name):
    schedule = SCHEDULES[schedule_name]
    plain = _model()
    model = copy.deepcopy(plain)
    x = torch.randn(4, 16)
    plain(x).square().sum().backward()
    expected = _grads(plain)
    gpu = CopyCountingGPU(lag)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = model(x).square().sum()
    loss.backward()
    profiled = engine.end_step()
    assert profiled is not None
    made = []
    for _ in range(4):
        model.zero_grad(set_to_none=True)
        gpu.copies_out = 0
        with engine.offload(model, schedule, sequence=profiled.sequence):
            loss = model(x).square().sum()
        loss.backward()
        stats = engine.end_step()
        assert stats is not None and stats.storages_swapped_out > 0
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected, strict=True))
        made.append(gpu.events.created)
    engine.close()
    gpu.synchronize()
    assert gpu.violations == []
    assert gpu.stale_waits == 0
    assert made[1] == made[2] == made[3], f"events made in steady-state passes: {made}"
    if schedule.max_copying_out_bytes is None:
        # Nothing waits on a copy out in forward: groups of small storages span layers.
        swapped_layers = stats.swapped_layers
        assert gpu.copies_out <= -(-stats.storages_swapped_out // COPY_GROUP_STORAGES) + 1 < swapped_layers
