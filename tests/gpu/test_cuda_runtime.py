"""On a CUDA GPU: the runtime's copies run on its copy stream, and the current stream is kept.

The runtime makes its copy stream current around each group of copies and makes the compute
stream current again (the pass's, or outside a pass the one current at the call), not through
``torch.cuda.stream``: these check that, with the default stream and with a side stream as the
compute stream; that copies compute would wait on at once run on the compute stream itself; and
that its events are reused from pass to pass."""

import pytest
import torch

from lightning_accudnn.ops import CudaRuntime

pytestmark = pytest.mark.cuda

LONG_STALL_CYCLES = 200_000_000  # about a tenth of a second on current GPUs


@pytest.mark.parametrize("compute_stream", ["default", "side"])
def test_copies_run_on_the_copy_stream_and_the_current_stream_is_kept(compute_stream):
    device = torch.device("cuda", torch.cuda.current_device())
    runtime = CudaRuntime(device)
    compute = torch.cuda.current_stream(device) if compute_stream == "default" else torch.cuda.Stream(device)
    with torch.cuda.stream(compute):
        source = torch.arange(1, 2**20 + 1, device=device, dtype=torch.float32)
        host = torch.zeros(source.shape, pin_memory=True)
        with torch.cuda.stream(runtime.copy_stream):
            torch.cuda._sleep(LONG_STALL_CYCLES)  # the copy stream is busy for a while
        copied = runtime.copy_out(runtime.record_compute(), [source], [host])
        assert torch.cuda.current_stream(device) == compute
        compute_done = torch.cuda.Event()
        compute_done.record(compute)
        compute_done.synchronize()
        # Compute is done, the copy is not: it waits behind the stall on the copy stream.
        assert not copied.event.query() and not host.any()
        back = runtime.allocate(tuple(source.shape), source.stride(), source.dtype)
        ready = runtime.copy_in(runtime.record_compute(), [host], [back])
        assert torch.cuda.current_stream(device) == compute
        runtime.wait(ready)
        assert torch.equal(back, source)  # read on compute, after its wait on the copy in
    torch.cuda.synchronize(device)


@pytest.mark.parametrize("compute_stream", ["default", "side"])
def test_copies_compute_waits_on_at_once_run_on_the_compute_stream(compute_stream):
    device = torch.device("cuda", torch.cuda.current_device())
    runtime = CudaRuntime(device)
    runtime.timing = False
    compute = torch.cuda.current_stream(device) if compute_stream == "default" else torch.cuda.Stream(device)
    with torch.cuda.stream(compute):
        runtime.begin_pass()
        source = torch.arange(1, 2**20 + 1, device=device, dtype=torch.float32)
        host = torch.zeros(source.shape, pin_memory=True)
        with torch.cuda.stream(runtime.copy_stream):
            torch.cuda._sleep(LONG_STALL_CYCLES)  # the copy stream is busy, with no group pending
        runtime.copy_out_now([source], [host])
        assert torch.cuda.current_stream(device) == compute
        compute_done = torch.cuda.Event()
        compute_done.record(compute)
        compute_done.synchronize()
        # Copied in compute order: done with compute, not behind the stall on the copy stream.
        assert torch.equal(host, source.cpu())
        back = runtime.allocate(tuple(source.shape), source.stride(), source.dtype)
        runtime.copy_in_now([host], [back])
        assert torch.cuda.current_stream(device) == compute
        assert torch.equal(back, source)
    torch.cuda.synchronize(device)


def test_events_are_reused_from_pass_to_pass():
    from torch import nn

    from lightning_accudnn.ops import OffloadEngine, SwapSchedule

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8))).to(device)
    engine = OffloadEngine(device, min_swap_bytes=0)
    runtime = engine.runtime
    assert isinstance(runtime, CudaRuntime)
    x = torch.randn(64, 256, device=device)
    made = []
    for _ in range(4):
        with engine.offload(model, SwapSchedule.swap_everything(2**20, max_copying_out_bytes=0)):
            loss = model(x).square().sum()
        loss.backward()
        stats = engine.end_step()
        assert stats is not None and stats.storages_swapped_out > 0
        made.append(runtime.events.created)
    engine.close()
    torch.cuda.synchronize(device)
    assert made[1] == made[2] == made[3]  # no event made after the first steps


def test_a_new_pinned_host_buffer_is_bracketed_as_a_stall_while_timing():
    class Recording:
        def __init__(self):
            self.marks = []

        def stall(self, before, after):
            self.marks.append((before, after))

    runtime = CudaRuntime(torch.device("cuda", torch.cuda.current_device()))
    runtime.begin_pass()
    runtime.stalls = recording = Recording()
    buffer = runtime.allocate_host(2**20)
    assert buffer.is_pinned() and buffer.dtype == torch.uint8 and buffer.numel() == 2**20
    ((before, after),) = recording.marks
    torch.cuda.synchronize()
    assert before.elapsed_time(after) >= 0.0
    runtime.timing = False
    runtime.allocate_host(2**10)
    assert len(recording.marks) == 1  # not timing: no marks
