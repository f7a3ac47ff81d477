"""Nothing lost when a step fails: no hooks, no held host buffers, a trainer that can fit again."""

import gc
import weakref

import pytest
import torch

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.planner.plan import BudgetTooSmallError
from tests._torch_internals import module_hook_count
from tests.models import Classifier, loader
from tests.strategy.helpers import StatsRecorder, memory_need, swapping_strategy, trainer_for


class FailingClassifier(Classifier):
    """Raises inside ``training_step`` (after the forward pass) at a chosen batch."""

    def __init__(self, fail_at: int | None) -> None:
        super().__init__("cnn")
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == self.fail_at:
            raise RuntimeError("failure inside training_step")
        return loss


def test_exception_in_training_step_leaves_nothing_behind_and_the_trainer_fits_again():
    strategy = swapping_strategy("cnn")
    model = FailingClassifier(fail_at=2)
    recorder = StatsRecorder()
    trainer = trainer_for(strategy, max_steps=4, callbacks=[recorder])
    with pytest.raises(RuntimeError, match="failure inside training_step"):
        trainer.fit(model, loader("cnn"))

    engine = strategy.offload.engine
    assert module_hook_count(model) == 0
    assert engine.pool.in_use_bytes == 0
    assert not engine.step_open
    assert len(recorder.stats) == 2

    model.fail_at = None
    trainer.fit(model, loader("cnn"))
    assert trainer.global_step == 4
    assert strategy.stats.bytes_swapped_out > 0
    assert strategy.offload.engine.pool.in_use_bytes == 0
    assert module_hook_count(model) == 0


def test_budget_too_small_names_the_smallest_budget_that_works_before_any_update():
    static, saved = memory_need("cnn")
    model = Classifier("cnn")
    before = {name: value.clone() for name, value in model.named_parameters()}
    strategy = AccUDNNStrategy(budget=static // 2, min_swap_bytes=0)
    with pytest.raises(BudgetTooSmallError) as raised:
        trainer_for(strategy).fit(model, loader("cnn"))
    assert static // 2 < raised.value.min_budget_bytes <= static + saved
    assert "at least" in str(raised.value)
    after = dict(model.named_parameters())
    assert all(torch.equal(value, after[name]) for name, value in before.items()), "no weight was updated"
    assert module_hook_count(model) == 0
    assert strategy.offload.engine.pool.in_use_bytes == 0

    # The named budget is enough.
    strategy = AccUDNNStrategy(budget=raised.value.min_budget_bytes, min_swap_bytes=0)
    trainer_for(strategy, max_steps=2).fit(Classifier("cnn"), loader("cnn"))
    assert strategy.stats.peak_device_bytes <= raised.value.min_budget_bytes


class SkipsBatches(Classifier):
    """Returns ``None`` from ``training_step`` for two batches (Lightning then runs no backward)
    and keeps a weak reference to every ReLU output, which ReLU saves for its backward."""

    def __init__(self) -> None:
        super().__init__("cnn")
        self.relu_outputs: list[weakref.ref] = []
        for module in self.modules():
            if isinstance(module, torch.nn.ReLU):
                module.register_forward_hook(self._note_output)

    def _note_output(self, module, args, output):
        self.relu_outputs.append(weakref.ref(output))

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return None if batch_idx in (2, 3) else loss


def test_the_graph_of_a_skipped_batch_is_freed():
    # A skipped batch's graph is dropped without a backward: nothing of it may outlive it (on a
    # GPU, its activations would stay allocated under every later step's plan).
    strategy = swapping_strategy("cnn", share_of_activations=0.5, policy="swap")
    module = SkipsBatches()
    trainer_for(strategy, max_steps=6).fit(module, loader("cnn", batches=8))
    gc.collect()
    assert module.relu_outputs and not [output for output in module.relu_outputs if output() is not None]
    assert strategy.offload.engine.pool.in_use_bytes == 0
    assert strategy.offload.engine.ledger.activation_bytes == 0
