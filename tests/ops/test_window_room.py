"""A storage the copy-out FIFO left on the device at the end of forward is read where it is, and
takes its bytes in the prefetch window until its backward is done: a copy in it leaves no room
for waits (what the planner's time model counts, :mod:`lightning_accudnn.planner.timeline`)."""

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import HostCopyRuntime, OffloadEngine, SwapSchedule


class Exp(nn.Module):
    def forward(self, x):
        return torch.exp(x)  # saves its result


class LoggingRuntime(HostCopyRuntime):
    """Host copies that log each copy in (``copy_in_now`` copies through ``copy_in`` here)."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def copy_in(self, after, hosts, dests):
        self.log.append("copy in")
        return super().copy_in(after, hosts, dests)


@pytest.mark.parametrize(
    ("window", "expected"), [(0, ["b's backward", "copy in"]), (2**20, ["copy in", "b's backward"])]
)
def test_a_copy_in_waits_for_the_room_a_storage_left_on_the_device_takes(window, expected):
    """``a`` and ``b`` each save a 4 KB result, both swapped at copy-out limit 0: ``a``'s copy
    is retired in forward, ``b``'s storage is still in the FIFO when it ends. With a window of
    0 bytes ``b``'s storage fills it, so ``a`` is copied in once ``b``'s backward is done; with
    room for both, at the backward's start."""
    log = []
    model = nn.Sequential()
    model.add_module("a", Exp())
    model.add_module("b", Exp())
    model.b.register_full_backward_hook(lambda *_: log.append("b's backward"))
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=LoggingRuntime(log))
    x = torch.randn(1024, requires_grad=True)
    schedule = SwapSchedule.swap_everything(prefetch_window_bytes=window, max_copying_out_bytes=0)
    with engine.offload(model, schedule):
        loss = model(x).sum()
    loss.backward()
    stats = engine.end_step()
    assert log == expected
    assert (stats.bytes_swapped_out, stats.bytes_swapped_in) == (2 * x.nbytes, x.nbytes)
    assert torch.equal(x.grad, torch.exp(torch.exp(x)) * torch.exp(x))
