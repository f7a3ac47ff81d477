"""The happens-before checker catches deliberately broken runtimes and engines.

Each break is confined to a subclass in this test; the same run with the real engine and
runtime is clean (tests/simulated/test_regression.py)."""

import contextlib

import pytest
import torch

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.testing import SimulatedGPU
from tests.models import loss_of, make_batch, make_model
from tests.simulated.helpers import train_simulated

# Copies out one at a time, in compute order (the copy-out limit retires each at once), and back
# in as one group on the copy stream when the backward begins.
BACK_IN_ONE_GROUP = SwapSchedule.swap_everything(2**30, max_copying_out_bytes=0)
# No copy-out limit: every copy out goes as one group on the copy stream when the forward ends,
# and backward reads each save where it was saved, after compute waited on that group.
OUT_IN_ONE_GROUP = SwapSchedule.swap_everything(0, max_copying_out_bytes=None)


class NoWaitBeforeRead(SimulatedGPU):
    """Compute reads a copy brought back without waiting on its copy-in event."""

    def use_on_compute(self, data, ready):
        super().use_on_compute(data, None)


class CopyInBeforeAllocation(SimulatedGPU):
    """The copy stream is ordered after a stale compute event, not after the allocation: the
    compute event is recorded once and never again."""

    def record_compute(self):
        if not hasattr(self, "first_event"):
            self.first_event = super().record_compute()
        return self.first_event


class EarlyFreeEngine(OffloadEngine):
    """Drops a swapped storage without making compute wait on its copy out."""

    def _settle_copy_out(self, step, record):
        record.copy_out_waited = True  # as if compute had waited: the wait is never issued
        super()._settle_copy_out(step, record)


def _run(gpu, engine_type=OffloadEngine, kind="cnn", schedule=BACK_IN_ONE_GROUP):
    torch.manual_seed(0)
    model = make_model(kind)
    batches = [make_batch(kind)]
    # A broken run may also read poison (bad gradients, bad indices): the checker is the point.
    with contextlib.suppress(AssertionError, IndexError, RuntimeError):
        train_simulated(model, batches, loss_of, schedule, gpu, engine_type)
    return gpu.violations


@pytest.mark.parametrize("lag", [0, None])
def test_a_missing_wait_before_a_copy_in_is_read_is_reported(lag):
    violations = _run(NoWaitBeforeRead(lag=lag))
    assert any(v.startswith("compute reads block") for v in violations), violations


def test_a_copy_in_not_ordered_after_its_allocation_is_reported():
    violations = _run(CopyInBeforeAllocation(lag=None))
    assert any(v.startswith("copy in writes block") for v in violations), violations


@pytest.mark.parametrize("lag", [0, None])
def test_an_early_free_of_a_source_being_copied_out_is_reported(lag):
    violations = _run(SimulatedGPU(lag=lag), EarlyFreeEngine, schedule=OUT_IN_ONE_GROUP)
    assert any(
        "freed on the compute stream while the copy stream may still touch it" in v for v in violations
    )


@pytest.mark.parametrize("schedule", [BACK_IN_ONE_GROUP, OUT_IN_ONE_GROUP])
def test_the_unbroken_run_is_clean(schedule):
    assert _run(SimulatedGPU(lag=None), schedule=schedule) == []


def test_reading_without_the_wait_reads_poison_at_unbounded_lag():
    torch.manual_seed(0)
    model = make_model("mlp")
    inputs = torch.randn(8, 64)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=NoWaitBeforeRead(lag=None))
    with engine.offload(model, BACK_IN_ONE_GROUP):
        loss = model(inputs).square().sum()
    loss.backward()
    assert not all(bool(p.grad.isfinite().all()) for p in model.parameters())


class CopiesNowWhilePending(SimulatedGPU):
    """Copies a group compute would wait on at once in compute order even while a group of
    copies on the copy stream is pending (the rule :class:`SimulatedGPU` shares with
    ``CudaRuntime``: only when none is)."""

    def _pending_group(self):
        return False


def _pending_copy_out(gpu):
    """A device block copied out to a host buffer by a group compute has not waited on."""
    source = gpu.allocate((64,), (1,), torch.float32)
    source.copy_(torch.arange(64.0))
    host = torch.empty(64)
    gpu.copy_out(gpu.record_compute(), [source], [host])
    return source, host


@pytest.mark.parametrize("gpu_type", [SimulatedGPU, CopiesNowWhilePending])
def test_a_copy_in_in_compute_order_of_a_host_buffer_still_being_written_is_reported(gpu_type):
    gpu = gpu_type(lag=None)
    source, host = _pending_copy_out(gpu)
    back = gpu.allocate((64,), (1,), torch.float32)
    gpu.copy_in_now([host], [back])
    if gpu_type is SimulatedGPU:  # the group is pending: copied on the copy stream, compute waits
        assert gpu.violations == [] and torch.equal(back, source)
    else:
        assert any(v.startswith("copy in on the compute stream reads host buffer") for v in gpu.violations)


@pytest.mark.parametrize("gpu_type", [SimulatedGPU, CopiesNowWhilePending])
def test_a_copy_out_in_compute_order_to_a_host_buffer_still_being_read_is_reported(gpu_type):
    gpu = gpu_type(lag=None)
    source, host = _pending_copy_out(gpu)
    gpu.wait(gpu.copy_out(gpu.record_compute(), [source], [host]))
    back = gpu.allocate((64,), (1,), torch.float32)
    gpu.copy_in(gpu.record_compute(), [host], [back])  # pending: it reads the host buffer later
    other = gpu.allocate((64,), (1,), torch.float32)
    other.fill_(7.0)
    gpu.copy_out_now([other], [host])
    if gpu_type is SimulatedGPU:  # the copy in is pending: the copy out goes after it on its stream
        gpu.synchronize()
        assert gpu.violations == [] and torch.equal(back, source)
    else:
        assert any(v.startswith("copy out on the compute stream writes host buffer") for v in gpu.violations)
