"""EfficiencyTuner in a Trainer: the size it picks, the bounds it keeps, the state it restores."""

import logging

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_accudnn import AccUDNNStrategy, EfficiencyTuner
from lightning_accudnn.callbacks import report
from tests.callbacks.helpers import (
    CurveModel,
    DataModule,
    VirtualClock,
    flat,
    peaked,
    rng_state,
    tuner_trainer,
)


def _tune(
    model: CurveModel, clock: VirtualClock, callbacks=(), strategy="auto", **options
) -> EfficiencyTuner:
    tuner = EfficiencyTuner(clock=clock, **options)
    tuner_trainer(tuner, callbacks=callbacks, strategy=strategy).fit(model)
    return tuner


def test_picks_the_size_with_the_highest_measured_throughput():
    clock = VirtualClock()
    model = CurveModel(batch_size=4, clock=clock, curve=peaked(best=16))
    tuner = _tune(model, clock)
    result = tuner.search_result
    assert [t.batch_size for t in result.trials] == [4, 8, 16, 32]  # 32 is past the peak: stop
    rates = {t.batch_size: t.samples_per_second for t in result.trials}
    assert rates[16] == pytest.approx(16 / peaked(best=16)(16))  # 1 warm-up + 3 timed steps
    assert result.chosen == 16 and model.batch_size == 16
    assert model.batches_seen[16] == 4 + 4  # the trial's steps, then the 4 training steps
    assert tuner.decision.batch_size == 16 and tuner.decision.start_batch_size == 4


def test_tolerance_prefers_the_smallest_size_close_to_the_best():
    clock = VirtualClock()
    model = CurveModel(batch_size=4, clock=clock, curve=peaked(best=16))
    # throughputs: 4: 376, 8: 640, 16: 800, 32: 640, 64: 376 samples/s
    tuner = _tune(model, clock, tolerance=0.25)
    assert [t.batch_size for t in tuner.search_result.trials] == [4, 8, 16, 32, 64]
    assert model.batch_size == 8


def test_the_search_stays_within_its_bounds():
    clock = VirtualClock()
    model = CurveModel(batch_size=4, clock=clock, curve=flat())
    tuner = _tune(model, clock, max_trials=3, steps_per_trial=2, trial_warmup_steps=2)
    assert [t.batch_size for t in tuner.search_result.trials] == [4, 8, 16]
    assert {size: model.batches_seen[size] for size in (4, 8)} == {4: 4, 8: 4}  # 2 + 2 each
    assert model.batch_size == 16

    clock = VirtualClock()
    model = CurveModel(batch_size=4, clock=clock, curve=flat(), samples=100)
    tuner = _tune(model, clock, max_batch_size=1000)
    assert max(t.batch_size for t in tuner.search_result.trials) == 64  # no larger than the data


class StateBefore(Callback):
    """Gives the optimizer some state, then records what the tuner must put back."""

    def on_fit_start(self, trainer, pl_module):
        optimizer = trainer.optimizers[0]
        loss = pl_module.net(torch.randn(4, 8)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}
        self.momentum = {k: v["momentum_buffer"].clone() for k, v in optimizer.state.items()}
        self.lr = optimizer.param_groups[0]["lr"]
        self.rng = rng_state()
        self.global_step = trainer.global_step


class StateAfter(Callback):
    def __init__(self, before: StateBefore) -> None:
        self.before = before

    def on_fit_start(self, trainer, pl_module):
        before = self.before
        optimizer = trainer.optimizers[0]
        for name, value in pl_module.state_dict().items():
            assert torch.equal(value, before.weights[name]), name
        assert all(p.grad is None for p in pl_module.parameters())
        assert set(optimizer.state) == set(before.momentum)
        for key, state in optimizer.state.items():
            assert torch.equal(state["momentum_buffer"], before.momentum[key])
        assert optimizer.param_groups[0]["lr"] == before.lr
        torch_rng, python_rng, numpy_rng = rng_state()
        assert torch.equal(torch_rng, before.rng[0]) and python_rng == before.rng[1]
        assert (numpy_rng == before.rng[2]).all()
        assert trainer.global_step == before.global_step == 0
        self.checked = True


def test_training_state_after_the_search_equals_the_state_before_it():
    clock = VirtualClock()
    model = CurveModel(batch_size=4, clock=clock, curve=peaked(best=8))
    before = StateBefore()
    after = StateAfter(before)
    tuner = EfficiencyTuner(clock=clock)
    Trainer(
        callbacks=[before, tuner, after],
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model)
    assert after.checked
    assert sum(model.batches_seen.values()) == 3 * 4 + 2  # three trials of 1 + 3 steps trained it
    assert tuner.decision.batch_size == 8


def test_batch_size_kept_in_a_datamodule_and_its_hparams():
    clock = VirtualClock()
    model = CurveModel(batch_size=999, clock=clock, curve=peaked(best=16))
    del model.batch_size
    datamodule = DataModule(batch_size=4)
    tuner = EfficiencyTuner(clock=clock)
    tuner_trainer(tuner).fit(model, datamodule=datamodule)
    assert datamodule.batch_size == 16 and datamodule.hparams.batch_size == 16
    assert model.batches_seen[16] > 0


class HparamLogger(Logger):
    name, version = "capture", 0

    def __init__(self) -> None:
        super().__init__()
        self.hparams = {}

    def log_hyperparams(self, params, *args, **kwargs):
        self.hparams.update(params)

    def log_metrics(self, metrics, step=None):
        pass


def test_table_printed_and_decision_logged_as_hyperparameters(caplog):
    clock = VirtualClock()
    model = CurveModel(batch_size=4, lr=0.1, clock=clock, curve=peaked(best=16))
    logger = HparamLogger()
    with caplog.at_level(logging.INFO):
        tuner = EfficiencyTuner(clock=clock)
        tuner_trainer(tuner, logger=logger).fit(model)
    table = next(r.getMessage() for r in caplog.records if "samples/s" in r.getMessage())
    assert "chosen batch size 16" in table
    assert [line.split()[0] for line in table.splitlines()[2:6]] == ["4", "8", "16", "32"]
    assert "`Trainer.fit` stopped: `max_steps=4`" not in caplog.text.split("EfficiencyTuner:")[1]
    assert logger.hparams["efficiency_tuner/batch_size"] == 16
    assert logger.hparams["efficiency_tuner/lr_factor"] == 4.0
    assert logger.hparams["efficiency_tuner/lr"] == pytest.approx(0.4)
    assert logger.hparams["efficiency_tuner/global_batch_size"] == 16


class OutOfMemoryAbove(CurveModel):
    def training_step(self, batch, batch_idx):
        if batch[0].shape[0] > 16:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return super().training_step(batch, batch_idx)


def test_without_a_budget_it_warns_and_learns_the_limit_from_out_of_memory_errors():
    clock = VirtualClock()
    model = OutOfMemoryAbove(batch_size=4, clock=clock, curve=flat())
    with pytest.warns(UserWarning, match="no memory budget"):
        tuner = _tune(model, clock)
    trials = tuner.search_result.trials
    assert [t.batch_size for t in trials] == [4, 8, 16, 32]
    assert trials[-1].failure == "out of memory"
    assert model.batch_size == 16


def test_under_accudnn_the_planner_rules_out_sizes_no_plan_fits():
    # Nothing is swappable (min_swap_bytes is huge): the peak grows with the batch and a
    # budget for about three times the activations of batch 8 fits batch 24, not 32.
    probe = CurveModel(batch_size=8, hidden=256)
    strategy = AccUDNNStrategy(budget="1GB", min_swap_bytes=2**40)
    tuner_trainer(None, strategy=strategy, max_steps=3).fit(probe)
    profile = strategy.plan.profile
    budget = profile.static_bytes + int(3.5 * profile.saved_bytes)

    clock = VirtualClock()
    model = CurveModel(batch_size=8, hidden=256, clock=clock, curve=flat())
    model.load_state_dict(probe.state_dict())
    strategy = AccUDNNStrategy(budget=budget, min_swap_bytes=2**40)
    tuner = _tune(model, clock, strategy=strategy)
    result = tuner.search_result
    assert [t.batch_size for t in result.trials] == [8, 16, 24]  # 24: the largest the budget fits
    assert all(t.ok for t in result.trials)
    assert not result.predictions[32].feasible and result.predictions[24].feasible
    assert model.batch_size == 24
    assert all(t.peak_bytes <= budget for t in result.trials)


class NoBatchSizeAttribute(CurveModel):
    def __init__(self):
        super().__init__()
        del self.batch_size

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)


class NoOptimizer(CurveModel):
    def configure_optimizers(self):
        return None


def test_bad_input_gets_an_error_naming_the_fix():
    with pytest.raises(
        MisconfigurationException, match="no batch-size attribute 'batch_size'.*batch_arg_name="
    ):
        tuner_trainer(EfficiencyTuner()).fit(NoBatchSizeAttribute())
    with pytest.raises(
        MisconfigurationException, match="passed straight to `Trainer.fit\\(\\)`.*train_dataloader"
    ):
        model = CurveModel()
        tuner_trainer(EfficiencyTuner()).fit(model, train_dataloaders=model.train_dataloader())
    with pytest.raises(MisconfigurationException, match="no optimizer.*lr_scaling='none'"):
        tuner_trainer(EfficiencyTuner()).fit(NoOptimizer())
    with pytest.raises(ValueError, match="lr_scaling must be one of"):
        EfficiencyTuner(lr_scaling="quadratic")


def test_the_experimental_whole_model_route_is_refused_before_any_trial():
    strategy = AccUDNNStrategy(budget="1GB", whole_model_compile="experimental")
    with pytest.raises(
        MisconfigurationException, match="does not tune on the experimental whole-model route"
    ):
        tuner_trainer(EfficiencyTuner(), strategy=strategy).fit(CurveModel())


def test_plot_needs_matplotlib_and_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(report.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install matplotlib"):
        EfficiencyTuner(plot_path=tmp_path / "throughput.png")


@pytest.mark.skipif(report.importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_is_saved(tmp_path):
    clock = VirtualClock()
    path = tmp_path / "throughput.png"
    _tune(CurveModel(batch_size=4, clock=clock, curve=peaked(best=16)), clock, plot_path=path)
    assert path.read_bytes().startswith(b"\x89PNG")
