"""Under Lightning, the garbage collector is off during each training pass (from its
forward to the end of its backward), on during validation and after fit, and back on after a
training step that raises."""

import gc

import pytest
import torch
from lightning.pytorch import Callback

from tests.models import Classifier, loader
from tests.strategy.helpers import swapping_strategy, trainer_for


class CollectorStates(Callback):
    """Whether the collector was on after each training forward, after each backward, in validation."""

    def __init__(self) -> None:
        self.after_forward: list[bool] = []
        self.after_backward: list[bool] = []
        self.in_validation: list[bool] = []

    def on_before_backward(self, trainer, module, loss) -> None:
        self.after_forward.append(gc.isenabled())

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.after_backward.append(gc.isenabled())

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.in_validation.append(gc.isenabled())


class FailsAtStepTwo(Classifier):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("a bug at step 2")
        return super().training_step(batch, batch_idx)


def test_the_collector_is_off_in_training_passes_only():
    assert gc.isenabled()
    torch.manual_seed(0)
    states = CollectorStates()
    trainer = trainer_for(
        swapping_strategy("mlp"), max_steps=4, callbacks=[states], limit_val_batches=1, val_check_interval=2
    )
    trainer.fit(Classifier("mlp"), loader("mlp", batches=4), loader("mlp", batches=1))
    assert states.after_forward == [False] * 4
    assert states.after_backward == [True] * 4
    assert states.in_validation and all(states.in_validation)
    assert gc.isenabled()


def test_a_training_step_that_raises_leaves_the_collector_on():
    trainer = trainer_for(swapping_strategy("mlp"), max_steps=4)
    with pytest.raises(RuntimeError, match="a bug at step 2"):
        trainer.fit(FailsAtStepTwo("mlp"), loader("mlp", batches=4))
    assert gc.isenabled()
