"""The engine's own host time in a pass replayed with its waits timed: its hooks and the work
around its copies, less the waits on copies inside them that held the host."""

import time

import pytest
import torch

from lightning_accudnn.ops import HostCopyRuntime, OffloadEngine, SwapSchedule, timing
from lightning_accudnn.ops.runtime import copy_each
from lightning_accudnn.ops.timing import HostWorkTimer, PassTimer, WallClock
from tests.models import MLP, loss_of, make_batch

COPY_SECONDS = 0.05


class SlowCopies(HostCopyRuntime):
    """Copies between CPU tensors that take :data:`COPY_SECONDS` each, timed as waits."""

    def copy_out(self, after, sources, hosts):
        start = time.perf_counter()
        time.sleep(COPY_SECONDS)
        copy_each(hosts, sources, non_blocking=False)
        self._copied(start)

    def copy_in(self, after, hosts, dests):
        start = time.perf_counter()
        time.sleep(COPY_SECONDS)
        copy_each(dests, hosts, non_blocking=False)
        self._copied(start)


def _pass(engine, model, schedule, sequence=None, *, time_waits=False):
    with engine.offload(model, schedule, sequence=sequence, time_waits=time_waits):
        loss = loss_of(model, make_batch("mlp"))
    loss.backward()
    return engine.end_step()


def _engine(runtime):
    model = MLP()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)
    schedule = SwapSchedule.swap_everything(max_copying_out_bytes=0)
    sequence = _pass(engine, model, schedule).sequence
    return engine, model, schedule, sequence


def test_a_timed_pass_reports_the_engines_host_time_and_an_untimed_one_none():
    engine, model, schedule, sequence = _engine(HostCopyRuntime())
    timed = _pass(engine, model, schedule, sequence, time_waits=True)
    forward, backward = timed.swap_host_seconds
    assert timed.storages_swapped_out > 0
    assert forward > 0.0 and backward > 0.0
    # On the CPU the host computes: its work is inside the pass's times, beside the waits.
    assert forward <= timed.forward_seconds - timed.stall_seconds[0]
    assert backward <= timed.backward_seconds - timed.stall_seconds[1]
    assert _pass(engine, model, schedule, sequence).swap_host_seconds == (0.0, 0.0)


def test_waits_on_copies_that_held_the_host_are_not_the_engines_time():
    engine, model, schedule, sequence = _engine(SlowCopies())
    timed = _pass(engine, model, schedule, sequence, time_waits=True)
    forward_waits, backward_waits = timed.stall_seconds
    assert forward_waits >= COPY_SECONDS and backward_waits >= COPY_SECONDS
    forward, backward = timed.swap_host_seconds  # not one copy's wait in them
    assert 0.0 < forward < COPY_SECONDS / 2 and 0.0 < backward < COPY_SECONDS / 2


def test_waits_timed_by_another_clock_pass_on_and_are_not_subtracted():
    passes = PassTimer(WallClock())
    passes.start()
    timer = HostWorkTimer(passes, host_marks=False)
    timer.start()
    timer.timed(lambda: timer.stall(0.0, 5.0))()  # a device's wait: the host went on
    passes.end_forward()
    assert passes.end_backward(wait=True) and passes.stalls_read == (5.0, 0.0)
    forward, backward = timer.read()
    assert 0.0 <= forward < 1.0 and backward == 0.0


@pytest.mark.parametrize("failing", [True, False])
def test_the_timed_work_leaves_its_count_even_when_it_raises(failing):
    timer = HostWorkTimer(PassTimer(WallClock()), host_marks=True)
    timer.start()

    def work():
        if failing:
            raise ValueError("the hook failed")

    if failing:
        with pytest.raises(ValueError):
            timer.timed(work)()
    else:
        timer.timed(work)()
    timer.timed(lambda: timer.stall(0.0, 5.0))()
    assert timer.read()[0] < 0.0  # the wait was inside timed work: subtracted, whatever raised


def test_work_timed_inside_timed_work_counts_once(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    timer = HostWorkTimer(PassTimer(WallClock()), host_marks=True)
    timer.start()

    def inner():
        now[0] += 1.0  # a second of the engine's work

    timed_inner = timer.timed(inner)
    timer.timed(lambda: timed_inner())()
    assert timer.read() == (1.0, 0.0)  # once, not twice
