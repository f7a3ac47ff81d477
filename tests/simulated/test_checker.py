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

ONE_IN_FLIGHT = SwapSchedule.swap_everything(0, max_copying_out_bytes=0)


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


def _run(gpu, engine_type=OffloadEngine, kind="cnn"):
    torch.manual_seed(0)
    model = make_model(kind)
    batches = [make_batch(kind)]
    # A broken run may also read poison (bad gradients, bad indices): the checker is the point.
    with contextlib.suppress(AssertionError, IndexError, RuntimeError):
        train_simulated(model, batches, loss_of, ONE_IN_FLIGHT, gpu, engine_type)
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
    violations = _run(SimulatedGPU(lag=lag), EarlyFreeEngine)
    assert any(
        "freed on the compute stream while the copy stream may still touch it" in v for v in violations
    )


def test_the_unbroken_run_is_clean():
    assert _run(SimulatedGPU(lag=None)) == []


def test_reading_without_the_wait_reads_poison_at_unbounded_lag():
    torch.manual_seed(0)
    model = make_model("mlp")
    inputs = torch.randn(8, 64)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=NoWaitBeforeRead(lag=None))
    with engine.offload(model, ONE_IN_FLIGHT):
        loss = model(inputs).square().sum()
    loss.backward()
    assert not all(bool(p.grad.isfinite().all()) for p in model.parameters())
