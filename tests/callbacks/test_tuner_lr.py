"""After tuning: the rate follows the rule, warmup ramps, schedules continue, checkpoints keep it."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.optim import lr_scheduler as schedulers

from lightning_accudnn import EfficiencyTuner
from lightning_accudnn.callbacks import LinearWarmup
from tests.callbacks.helpers import CurveModel, LrRecorder, VirtualClock, flat, tuner_trainer

SAMPLES = 256


def _fit(model, tuner, max_epochs=2, recorder=None, **options):
    recorder = recorder or LrRecorder()
    tuner_trainer(tuner, callbacks=[recorder], max_steps=-1, max_epochs=max_epochs, **options).fit(model)
    return recorder


def _tuner(chosen: int, **options) -> EfficiencyTuner:
    """A tuner whose only candidate is ``chosen``: the search is one trial, the tests are exact."""
    return EfficiencyTuner(batch_sizes=[chosen], clock=VirtualClock(), **options)


@pytest.mark.parametrize(
    ("optimizer", "rule", "expected"),
    [("sgd", "auto", 0.4), ("adam", "auto", 0.2), ("sgd", "sqrt", 0.2), ("sgd", "none", 0.1)],
)
def test_learning_rate_after_tuning_follows_the_rule(optimizer, rule, expected):
    model = CurveModel(batch_size=8, lr=0.1, optimizer=optimizer, samples=SAMPLES)
    tuner = _tuner(32, lr_scaling=rule)
    recorder = _fit(model, tuner, max_epochs=1)
    assert model.batch_size == 32 and set(recorder.batch_sizes) == {32}
    assert recorder.used == pytest.approx([expected] * (SAMPLES // 32))
    assert tuner.decision.learning_rates == [[pytest.approx(expected)]]


def test_global_batch_and_given_base_batch_drive_the_rule():
    model = CurveModel(batch_size=8, lr=0.1, samples=SAMPLES)
    tuner = _tuner(32, base_batch_size=16, lr_scaling=lambda ratio: ratio**2)
    recorder = _fit(model, tuner, max_epochs=1, accumulate_grad_batches=2)
    # global batch 32 x 2 accumulated = 64, over the given base 16: ratio 4, rule ratio^2
    assert tuner.decision.global_batch_size == 64
    assert recorder.used == pytest.approx([0.1 * 16] * (SAMPLES // 64))


@pytest.mark.parametrize(("steps", "epochs", "length"), [(4, None, 4), (None, 1.5, 12)])
def test_warmup_ramps_from_the_old_to_the_new_learning_rate(steps, epochs, length):
    model = CurveModel(batch_size=8, lr=0.1, samples=SAMPLES)
    tuner = _tuner(32, warmup_steps=steps, warmup_epochs=epochs)
    recorder = _fit(model, tuner, max_epochs=2)  # 8 steps per epoch
    assert tuner.decision.warmup_steps == length
    warmup = LinearWarmup(length, start_factor=0.25)
    assert recorder.used == pytest.approx([0.4 * warmup(step) for step in range(16)])
    assert recorder.used[0] == pytest.approx(0.1)  # Goyal et al.: start at the old rate
    assert model.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.4)


def _reference(kind: str, lr: float, total_steps: int, steps_per_epoch: int) -> list[float]:
    """What a scheduler built for the tuned batch and learning rate gives, step by step."""
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=lr)
    if kind == "steplr":
        scheduler = schedulers.StepLR(optimizer, step_size=1, gamma=0.5)
    elif kind == "cosine":
        scheduler = schedulers.CosineAnnealingLR(optimizer, T_max=total_steps, eta_min=lr / 100)
    else:
        scheduler = schedulers.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps)
    used = []
    for step in range(total_steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if kind != "steplr" or (step + 1) % steps_per_epoch == 0:
            scheduler.step()
    return used


@pytest.mark.parametrize("kind", ["steplr", "cosine", "onecycle"])
@pytest.mark.parametrize(("start", "chosen"), [(8, 32), (32, 8)], ids=["larger", "smaller"])
def test_user_schedules_continue_correctly_at_the_new_batch_and_rate(kind, start, chosen):
    epochs = 2
    model = CurveModel(batch_size=start, lr=0.1, scheduler=kind, samples=SAMPLES)
    tuner = _tuner(chosen, warmup_steps=3)
    recorder = _fit(model, tuner, max_epochs=epochs)
    steps_per_epoch = SAMPLES // chosen
    factor = chosen / start
    expected = _reference(kind, 0.1 * factor, epochs * steps_per_epoch, steps_per_epoch)
    warmup = LinearWarmup(3, start_factor=min(1.0, 1 / factor))
    assert len(recorder.used) == epochs * steps_per_epoch  # OneCycleLR did not run out of steps
    assert recorder.used == pytest.approx([lr * warmup(step) for step, lr in enumerate(expected)])


class StopAfterEpochs(Callback):
    """Ends a run early, as if it had been interrupted: the checkpoint plans for the whole run."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def test_fit_checkpoint_resume_keeps_batch_size_and_learning_rate_without_tuning_again(tmp_path):
    def run(max_epochs, callbacks=(), ckpt_path=None):
        clock = VirtualClock()  # flat curve: the largest candidate, 32, wins
        model = CurveModel(
            batch_size=8, lr=0.1, scheduler="onecycle", samples=SAMPLES, clock=clock, curve=flat()
        )
        tuner = EfficiencyTuner(max_batch_size=32, clock=clock, warmup_steps=20)
        recorder = LrRecorder()
        trainer = tuner_trainer(
            tuner,
            callbacks=[recorder, *callbacks],
            max_steps=-1,
            max_epochs=max_epochs,
            default_root_dir=tmp_path,
            enable_checkpointing=bool(callbacks),
        )
        trainer.fit(model, ckpt_path=ckpt_path)
        return model, tuner, recorder

    whole, _, reference = run(max_epochs=4)  # uninterrupted: 4 epochs of 8 steps at batch 32
    assert whole.batch_size == 32 and len(reference.used) == 32
    warmup = LinearWarmup(20, start_factor=0.25)
    one_cycle = _reference("onecycle", 0.4, total_steps=32, steps_per_epoch=8)
    assert reference.used == pytest.approx([lr * warmup(step) for step, lr in enumerate(one_cycle)])

    interrupted = [StopAfterEpochs(2), ModelCheckpoint(dirpath=tmp_path, save_last=True)]
    first, _, part_one = run(max_epochs=4, callbacks=interrupted)
    assert first.batch_size == 32 and len(part_one.used) == 16  # the warmup (20 steps) is not over

    resumed, tuner, part_two = run(max_epochs=4, ckpt_path=tmp_path / "last.ckpt")
    assert tuner.search_result is None  # no new search
    assert set(resumed.batches_seen) == {32} and resumed.batch_size == 32
    assert tuner.decision.batch_size == 32 and tuner.decision.lr_factors == [4.0]
    assert part_one.used + part_two.used == pytest.approx(reference.used)
