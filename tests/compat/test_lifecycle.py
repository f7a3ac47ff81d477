"""The strategy across Lightning's lifecycle: eval loops, checkpoints, repeated fits, failures."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.ops import HostMemoryExceeded
from lightning_accudnn.session.compiled import CompiledModelError
from tests._torch_internals import forward_pre_hook_count, module_hook_count
from tests.models import Classifier, loader
from tests.strategy.helpers import memory_need, trainer_for


def _strategy(**options):
    static, saved = memory_need("cnn")
    return AccUDNNStrategy(budget=static + saved // 2, min_swap_bytes=0, **options)


class HookCounting(Classifier):
    """Records the module hooks present while each kind of step runs."""

    def __init__(self):
        super().__init__("cnn")
        self.hooks_seen = {}

    def _note(self, kind):
        self.hooks_seen.setdefault(kind, set()).add(module_hook_count(self))

    def training_step(self, batch, batch_idx):
        self._note("train")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._note("validate")
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self._note("test")

    def predict_step(self, batch, batch_idx):
        self._note("predict")
        return self.model(batch[0])


def test_validation_test_and_predict_run_without_hooks():
    model = HookCounting()
    strategy = _strategy()
    trainer = trainer_for(
        strategy, max_steps=2, limit_val_batches=2, num_sanity_val_steps=0, val_check_interval=2
    )
    trainer.fit(model, loader("cnn"), loader("cnn", batches=2))
    swapped = strategy.stats.bytes_swapped_out
    trainer.validate(model, loader("cnn", batches=2))
    trainer.test(model, loader("cnn", batches=2))
    trainer.predict(model, loader("cnn", batches=2))
    assert min(model.hooks_seen["train"]) > 0  # the layer tracker is on during training steps
    assert model.hooks_seen["validate"] == model.hooks_seen["test"] == model.hooks_seen["predict"] == {0}
    assert strategy.stats.bytes_swapped_out == swapped  # no step of the eval loops went through the engine


def test_checkpoint_resume_mid_epoch_and_fit_twice(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    model = Classifier("cnn")
    trainer = trainer_for(_strategy(), max_steps=2, callbacks=[checkpoints], enable_checkpointing=True)
    trainer.fit(model, loader("cnn", batches=6))
    saved = next(tmp_path.glob("*step=2.ckpt"))

    resumed_strategy = _strategy()
    resumed = trainer_for(resumed_strategy, max_steps=5, enable_checkpointing=False)
    resumed.fit(Classifier("cnn"), loader("cnn", batches=6), ckpt_path=saved)
    assert resumed.global_step == 5
    assert resumed_strategy.stats.bytes_swapped_out > 0

    # The same trainer fits again, further.
    trainer.fit_loop.epoch_loop.max_steps = 4
    trainer.fit(model, loader("cnn", batches=6))
    assert trainer.global_step == 4
    assert module_hook_count(model) == 0


def test_host_memory_limit_fails_early_naming_both_budgets():
    model = Classifier("cnn")
    strategy = _strategy(host_memory_limit=50_000)
    with pytest.raises(HostMemoryExceeded, match="host_memory_limit"):
        trainer_for(strategy).fit(model, loader("cnn"))
    assert module_hook_count(model) == 0
    assert strategy.offload.engine.pool.in_use_bytes == 0

    static, saved = memory_need("cnn")
    strategy = _strategy(host_memory_limit=int(1.2 * saved))  # profiling fits, the plan must too
    trainer_for(strategy, max_steps=2).fit(Classifier("cnn"), loader("cnn"))
    assert strategy.plan.swapped_bytes <= 1.2 * saved


class FailsOnce(Classifier):
    def __init__(self, error, at=1):
        super().__init__("cnn")
        self.error = error
        self.at = at

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == self.at and self.error is not None:
            error, self.error = self.error, None
            raise error
        return loss


def test_out_of_memory_that_ends_the_run_leaves_a_usable_trainer():
    # In the profiling step: not retried (a planned step is; tests/strategy/test_out_of_memory.py).
    model = FailsOnce(torch.OutOfMemoryError("CUDA out of memory (simulated)"), at=0)
    strategy = _strategy()
    trainer = trainer_for(strategy, max_steps=3)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.fit(model, loader("cnn"))
    assert module_hook_count(model) == 0
    assert strategy.offload.engine.pool.in_use_bytes == 0
    trainer.fit(model, loader("cnn"))
    assert trainer.global_step == 3


def test_keyboard_interrupt_mid_step_shuts_down_cleanly():
    model = FailsOnce(KeyboardInterrupt())
    strategy = _strategy()
    trainer = trainer_for(strategy, max_steps=3)
    with pytest.raises(SystemExit):  # Lightning's graceful shutdown ends with exit(1)
        trainer.fit(model, loader("cnn"))
    assert trainer.interrupted
    assert module_hook_count(model) == 0
    assert strategy.offload.engine.pool.in_use_bytes == 0


class CountsHooksInStep(Classifier):
    def training_step(self, batch, batch_idx):
        self.pre_hooks_on_stem = forward_pre_hook_count(self.model.stem[0])
        return super().training_step(batch, batch_idx)


def test_a_second_strategy_on_the_same_model_does_not_stack_hooks():
    model = CountsHooksInStep("cnn")
    trainer_for(_strategy(), max_steps=2).fit(model, loader("cnn"))
    trainer_for(_strategy(), max_steps=2).fit(model, loader("cnn"))
    assert model.pre_hooks_on_stem == 1
    assert module_hook_count(model) == 0


def _lightning_module_compiled():
    model = Classifier("cnn")
    model.compile()  # LightningModule.compile(), nn.Module's in-place form
    return model, model


def _torch_compiled():
    model = Classifier("cnn")
    return model, torch.compile(model)  # Lightning unwraps it and remembers it was compiled


@pytest.mark.parametrize(
    ("make", "form"),
    [
        (_lightning_module_compiled, "Classifier.compile() on the model"),
        (_torch_compiled, "torch.compile(model) of the LightningModule"),
    ],
    ids=["LightningModule.compile()", "torch.compile(model)"],
)
def test_every_whole_model_compile_is_refused_before_training_with_one_message(make, form):
    model, given = make()
    before = {name: value.clone() for name, value in model.named_parameters()}
    with pytest.raises(CompiledModelError) as raised:
        trainer_for(_strategy()).fit(given, loader("cnn"))
    assert f"found {form}" in str(raised.value)
    assert "block.compile()" in str(raised.value)  # the message shows the regional form
    assert "whole_model_compile='experimental'" in str(raised.value)  # and names the experimental option
    assert all(torch.equal(value, dict(model.named_parameters())[name]) for name, value in before.items())
