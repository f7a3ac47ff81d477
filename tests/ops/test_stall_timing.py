"""Waits of compute on copies are no layer's compute time: the profile the planner learns from
holds the layers' own time even when the profiling pass swaps everything over a slow link."""

import time

import torch

from lightning_accudnn.ops import HostCopyRuntime, OffloadEngine, SwapSchedule
from lightning_accudnn.ops.timing import LayerTimer
from lightning_accudnn.testing import SimulatedGPU
from tests.models import MLP, loss_of, make_batch

COPY_SECONDS = 0.02  # each group of copies on the slow link


class ScriptedClock:
    """Marks are numbers the test writes down; an interval is their difference."""

    def __init__(self):
        self.now = 0.0

    def mark(self):
        return self.now

    def seconds_between(self, start, end):
        return end - start

    def ready(self, mark):
        return True


def test_a_stall_in_forward_is_cut_out_of_the_layer_it_falls_in():
    clock = ScriptedClock()
    timer = LayerTimer(clock)
    timer.start()
    clock.now = 1.0
    timer.enter("conv")
    clock.now = 3.0
    timer.stall(3.0, 10.0)  # compute waited 7 s on a copy inside "conv"
    clock.now = 11.0
    timer.exit("conv")
    clock.now = 12.0
    timer.end_forward()
    clock.now = 20.0
    timer.stall(14.0, 18.0)  # and 4 s in backward
    clock.now = 25.0
    timer.end_backward()
    timer.stall(25.0, 30.0)  # after backward: nothing of the step's
    seconds = timer.forward_self_seconds()
    assert seconds == {"(root)": 2.0, "conv": 3.0}
    assert timer.backward_seconds() == 9.0


def test_stalls_before_start_are_ignored():
    clock = ScriptedClock()
    timer = LayerTimer(clock)
    timer.stall(0.0, 5.0)
    timer.start()
    clock.now = 1.0
    timer.end_forward()
    timer.end_backward()
    assert timer.forward_self_seconds() == {"(root)": 1.0}
    assert timer.backward_seconds() == 0.0


class SlowLink(HostCopyRuntime):
    """Host copies that take :data:`COPY_SECONDS` each, as a slow link would."""

    copies = 0

    def copy_out(self, after, sources, hosts):
        return super().copy_out(after, [_Slow(source) for source in sources], hosts)

    def copy_in(self, after, hosts, dests):
        return super().copy_in(after, [_Slow(host) for host in hosts], dests)


class _Slow(torch.Tensor):
    """A tensor whose copy from it sleeps first (inside the runtime's bracket around the copy)."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_subclass(cls, data)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            SlowLink.copies += 1
            time.sleep(COPY_SECONDS)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _profiled_seconds(runtime):
    model = MLP()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)
    with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_in > 0
    return stats.forward_seconds + stats.backward_seconds, stats.wait_seconds


def test_copy_time_on_a_slow_link_is_not_learnt_as_compute():
    SlowLink.copies = 0
    compute, waited = _profiled_seconds(SlowLink())
    copies = SlowLink.copies * COPY_SECONDS
    assert SlowLink.copies >= 4
    assert waited >= copies  # the copies were waited for ...
    assert compute < copies / 2  # ... and none of that is the layers' compute


def test_the_simulated_gpu_reports_its_waits_as_stalls():
    class Recording:
        def __init__(self, timer):
            self.timer, self.seconds = timer, []

        def stall(self, before, after):
            self.seconds.append(after - before)
            self.timer.stall(before, after)

    gpu = SimulatedGPU(lag=None)
    model = MLP()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
    assert gpu.stalls is engine.timer
    gpu.stalls = recording = Recording(engine.timer)
    with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    assert engine.end_step() is not None
    assert recording.seconds and all(seconds >= 0.0 for seconds in recording.seconds)
    assert not gpu.violations
