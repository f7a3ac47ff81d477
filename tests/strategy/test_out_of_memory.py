"""A device out-of-memory error inside a planned step re-plans with a larger reserve and retries it."""

import gc
import logging
import weakref

import pytest
import torch
from lightning.pytorch import Callback

from lightning_accudnn.ops import HostCopyRuntime
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session.out_of_memory import (
    MAX_OUT_OF_MEMORY_RETRIES,
    OutOfMemoryAfterRetriesError,
    ProfilingPassOutOfMemoryError,
)
from tests.models import Classifier, loader
from tests.strategy.helpers import StatsRecorder, copies, swapping_strategy, trainer_for


class FaultyDevice(HostCopyRuntime):
    """Host copies that raise ``torch.OutOfMemoryError`` on the next ``hold`` (forward) or
    ``allocate`` (backward prefetch) once armed, ``times`` times in a row."""

    tracks_blocks = True  # the engine then calls hold on every kept save too

    def __init__(self, where: str, times: int = 1) -> None:
        super().__init__()
        self.where = where
        self.times = times
        self.armed = False
        self.fired = 0

    def _maybe_fail(self, operation: str) -> None:
        if self.armed and operation == self.where and self.fired < self.times:
            self.fired += 1
            raise torch.OutOfMemoryError(f"injected out of memory in {operation}")

    def hold(self, key, nbytes):
        self._maybe_fail("hold")
        super().hold(key, nbytes)

    def allocate(self, shape, stride, dtype):
        self._maybe_fail("allocate")
        return super().allocate(shape, stride, dtype)


class ArmAt(Callback):
    def __init__(self, device: FaultyDevice, batch_idx: int) -> None:
        self.device = device
        self.batch_idx = batch_idx

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.device.armed = batch_idx >= self.batch_idx


@pytest.mark.parametrize("where", ["hold", "allocate"], ids=["forward", "backward"])
def test_injected_oom_in_a_planned_step_replans_and_the_fit_equals_plain_training(where, caplog):
    plain, swapped = copies("cnn")
    trainer_for("auto", max_steps=5).fit(plain, loader("cnn", batches=5))

    device = FaultyDevice(where)
    strategy = swapping_strategy("cnn", share_of_activations=0.8, runtime=device, policy="swap")
    recorder = StatsRecorder()
    trainer = trainer_for(strategy, max_steps=5, callbacks=[recorder, ArmAt(device, batch_idx=3)])
    with caplog.at_level(logging.WARNING, logger="lightning_accudnn"):
        trainer.fit(swapped, loader("cnn", batches=5))

    assert device.fired == 1, "the injected error should have been raised once"
    assert trainer.global_step == 5
    assert strategy.offload.reserve_bytes == strategy.offload.budget_bytes // 8  # grown once from 0
    assert any(
        "out of memory" in record.message and "re-planned" in record.message for record in caplog.records
    )
    assert recorder.plans[3] is not recorder.plans[2], "the step after the error ran a new plan"
    assert (
        recorder.plans[3].predicted_peak_bytes
        <= strategy.offload.budget_bytes - strategy.offload.reserve_bytes
    )
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs"
    assert strategy.offload.engine.pool.in_use_bytes == 0


def test_oom_that_persists_ends_the_run_after_a_bounded_number_of_retries_saying_what_to_do():
    device = FaultyDevice("hold", times=100)
    strategy = swapping_strategy("cnn", share_of_activations=0.8, runtime=device, policy="swap")
    trainer = trainer_for(strategy, max_steps=5, callbacks=[ArmAt(device, batch_idx=2)])
    with pytest.raises(OutOfMemoryAfterRetriesError, match="4 times in a row.*Raise the budget") as raised:
        trainer.fit(copies("cnn")[0], loader("cnn", batches=5))
    assert isinstance(raised.value, torch.OutOfMemoryError)
    assert "injected" in str(raised.value) and "injected" in str(raised.value.__cause__)
    assert device.fired == MAX_OUT_OF_MEMORY_RETRIES + 1
    assert raised.value.budget_bytes == strategy.offload.budget_bytes
    assert raised.value.reserve_bytes == strategy.offload.reserve_bytes > 0
    del raised  # its traceback holds the failed pass; once it is gone, nothing is left held
    gc.collect()
    assert strategy.offload.engine.pool.in_use_bytes == 0


def test_oom_in_the_profiling_step_is_not_retried_and_says_the_budget_is_too_small():
    device = FaultyDevice("hold")
    strategy = swapping_strategy("cnn", runtime=device)
    trainer = trainer_for(strategy, max_steps=2, callbacks=[ArmAt(device, batch_idx=0)])
    model = copies("cnn")[0]
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ProfilingPassOutOfMemoryError, match="too small.*Raise the budget") as raised:
        trainer.fit(model, loader("cnn", batches=2))
    assert isinstance(raised.value, torch.OutOfMemoryError)
    assert "injected" in str(raised.value) and "injected" in str(raised.value.__cause__)
    assert raised.value.budget_bytes == strategy.offload.budget_bytes
    assert device.fired == 1
    assert strategy.offload.reserve_bytes == 0
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} changed"


class KeepsStemOutputInACycle(Classifier):
    """Its stem's output is kept by a reference cycle (as a failed pass's traceback frames keep
    tensors): at each training step it notes whether the previous call's output is still alive."""

    def __init__(self) -> None:
        super().__init__("cnn")
        self.last_output: weakref.ref | None = None
        self.calls: list[tuple[int, bool]] = []
        self.model.stem.register_forward_hook(self._keep_in_a_cycle)

    def _keep_in_a_cycle(self, module, inputs, output):
        holder = {"output": output}
        holder["self"] = holder
        self.last_output = weakref.ref(output)

    def training_step(self, batch, batch_idx):
        alive = self.last_output is not None and self.last_output() is not None
        self.calls.append((batch_idx, alive))
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("where", ["hold", "allocate"], ids=["forward", "backward"])
def test_a_retried_step_starts_without_what_the_failed_pass_left_in_reference_cycles(where):
    """On a GPU those tensors are device memory the retry's plan does not count (the demo's
    retries on an H100 ran out of memory with far more allocated than planned)."""
    device = FaultyDevice(where)
    module = KeepsStemOutputInACycle()
    strategy = swapping_strategy("cnn", share_of_activations=0.8, runtime=device, policy="swap")
    trainer = trainer_for(strategy, max_steps=5, callbacks=[ArmAt(device, batch_idx=3)])
    gc.disable()  # no collection by chance: only the one the retry asks for
    try:
        trainer.fit(module, loader("cnn", batches=5))
    finally:
        gc.enable()
    assert device.fired == 1
    batches = [batch_idx for batch_idx, _ in module.calls]
    assert batches == [0, 1, 2, 3, 3, 4]
    assert module.calls[4] == (3, False), "the failed pass's stem output outlived it into the retry"


def test_the_buffer_copy_a_retry_starts_from_is_counted_as_model_state():
    model = copies("cnn")[0]
    strategy = swapping_strategy("cnn", share_of_activations=0.8, policy="swap")
    recorder = StatsRecorder()
    trainer = trainer_for(strategy, max_steps=3, callbacks=[recorder])
    trainer.fit(model, loader("cnn", batches=3))

    buffers = sum(buffer.untyped_storage().nbytes() for buffer in model.buffers())
    assert buffers > 0, "the model needs BatchNorm buffers for this test to say anything"
    assert strategy.offload.buffer_snapshot_bytes == buffers
    state = model_state_bytes(model, trainer.optimizers)
    assert recorder.plans[-1].profile.static_bytes == state + buffers
