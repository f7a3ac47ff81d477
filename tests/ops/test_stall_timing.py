"""Waits of compute on copies are no layer's compute time: the profile the planner learns from
holds the layers' own time even when the profiling pass swaps everything over a slow link."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_accudnn.ops import HostCopyRuntime, OffloadEngine, SwapSchedule
from lightning_accudnn.ops import runtime as runtime_module
from lightning_accudnn.ops import timing as timing_module
from lightning_accudnn.ops.timing import LayerTimer
from lightning_accudnn.testing import SimulatedGPU
from tests.models import MLP, loss_of, make_batch

COPY_SECONDS = 1.0  # each copy on the slow link, on the virtual clock


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


class VirtualClock:
    """``time`` for the runtime and the layer timer: a clock that advances a microsecond per
    reading, and :data:`COPY_SECONDS` per copy on the slow link (no real waiting: the figures do
    not depend on the machine's load)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 1e-6
        return self.now


class SlowLink(HostCopyRuntime):
    """Host copies that take :data:`COPY_SECONDS` each on ``clock``, as a slow link would."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.copies = 0

    def copy_out(self, after, sources, hosts):
        return super().copy_out(after, [_Slow(source, self) for source in sources], hosts)

    def copy_in(self, after, hosts, dests):
        return super().copy_in(after, [_Slow(host, self) for host in hosts], dests)


class _Slow(torch.Tensor):
    """A tensor whose copy from it takes :data:`COPY_SECONDS` of ``link``'s clock (inside the
    runtime's bracket around the copy)."""

    @staticmethod
    def __new__(cls, data, link):
        tensor = torch.Tensor._make_subclass(cls, data)
        tensor.link = link
        return tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            link = args[1].link
            link.copies += 1
            link.clock.now += COPY_SECONDS
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_copy_time_on_a_slow_link_is_not_learnt_as_compute(monkeypatch):
    clock = VirtualClock()
    monkeypatch.setattr(runtime_module, "time", clock)
    monkeypatch.setattr(timing_module, "time", clock)
    link = SlowLink(clock)
    model = MLP()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=link)
    with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_in > 0
    copies = link.copies * COPY_SECONDS
    assert link.copies >= 4
    assert stats.wait_seconds >= copies  # the copies were waited for ...
    assert stats.forward_seconds + stats.backward_seconds < 0.01  # ... and none of it is compute


class SlowPinning(TorchDispatchMode):
    """Each new host buffer (a flat ``uint8`` allocation) takes a second of ``clock``, as pinning
    many large buffers on a GPU's host does."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.buffers = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.empty.memory_format and kwargs.get("dtype") == torch.uint8:
            self.buffers += 1
            self.clock.now += 1.0
        return func(*args, **kwargs)


def test_pinning_new_host_buffers_is_not_learnt_as_compute(monkeypatch):
    """The profiling pass swaps everything and so allocates every host buffer the pool will
    hold: that host time is no layer's compute."""
    clock = VirtualClock()
    monkeypatch.setattr(runtime_module, "time", clock)
    monkeypatch.setattr(timing_module, "time", clock)
    model = MLP()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=HostCopyRuntime())
    with SlowPinning(clock) as pinning:
        with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
            loss = loss_of(model, make_batch("mlp"))
        loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_out > 0
    assert pinning.buffers == engine.pool.allocations >= 4
    assert stats.forward_seconds + stats.backward_seconds < 0.01


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
    with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        assert gpu.stalls is engine.timer  # a hooked pass: its layer timer hears of the waits
        gpu.stalls = recording = Recording(engine.timer)
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    assert engine.end_step() is not None
    assert recording.seconds and all(seconds >= 0.0 for seconds in recording.seconds)
    assert not gpu.violations


def _replayed_pass(engine, model, schedule, sequence, *, time_waits):
    with engine.offload(model, schedule, sequence=sequence, time_waits=time_waits):
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    return engine.end_step()


def test_a_pass_replayed_with_its_waits_timed_reports_them_and_one_without_reports_none():
    """Swapping everything one copy at a time, compute waits on each copy out in forward and
    each copy in in backward; the pass's whole times hold those waits."""
    gpu = SimulatedGPU(lag=None)
    model = MLP()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
    schedule = SwapSchedule.swap_everything(max_copying_out_bytes=0)
    with engine.offload(model, schedule):
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    sequence = engine.end_step().sequence
    timed = _replayed_pass(engine, model, schedule, sequence, time_waits=True)
    forward_waits, backward_waits = timed.stall_seconds
    assert not timed.timed and forward_waits > 0.0 and backward_waits > 0.0
    assert forward_waits <= timed.forward_seconds and backward_waits <= timed.backward_seconds
    untimed = _replayed_pass(engine, model, schedule, sequence, time_waits=False)
    assert untimed.stall_seconds == (0.0, 0.0) and not gpu.timing
    assert not gpu.violations
