"""Training through the Trainer with AccUDNNStrategy: equal results, budget kept, stats exposed."""

import pytest
import torch
from lightning.pytorch.loggers.logger import Logger

from lightning_accudnn import AccUDNNStrategy
from tests.models import loader
from tests.strategy.helpers import StatsRecorder, copies, memory_need, swapping_strategy, trainer_for


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_fit_with_swapping_equals_plain_fit_bitwise(kind):
    plain_model, swapped_model = copies(kind)
    trainer_for("auto").fit(plain_model, loader(kind))

    recorder = StatsRecorder()
    strategy = swapping_strategy(kind)
    trainer_for(strategy, callbacks=[recorder]).fit(swapped_model, loader(kind))

    assert strategy.plan is not None and strategy.plan.swapped_layers, "the budget should force swapping"
    assert all(stats.bytes_swapped_out > 0 for stats in recorder.stats)
    for (name, a), b in zip(
        plain_model.state_dict().items(), swapped_model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"{name} differs"


def test_ledger_peak_stays_within_a_budget_that_forces_swapping():
    static, saved = memory_need("cnn")
    budget = static + int(0.4 * saved)
    recorder = StatsRecorder()
    strategy = AccUDNNStrategy(budget=budget, min_swap_bytes=0)
    model, _ = copies("cnn")
    trainer_for(strategy, max_steps=6, callbacks=[recorder]).fit(model, loader("cnn", batches=6))

    assert static + saved > budget  # without swapping it would not fit
    for stats in recorder.stats:
        assert stats.peak_device_bytes <= budget
        assert stats.bytes_swapped_out > 0
    planned = [stats for stats in recorder.stats if not stats.profiling]
    assert planned, "steps after the profiling step run the plan"
    assert recorder.plans[-1].predicted_peak_bytes <= budget
    # The simulator is conservative: no planned step passes the peak its plan predicted.
    assert all(stats.peak_device_bytes <= stats.predicted_peak_bytes for stats in planned)


@pytest.mark.parametrize("share", [0.5, 0.4, 0.35])
def test_storages_saved_by_several_layers_come_back_in_time(share):
    """In a Bottleneck a block's input is saved three times and needed first by the downsample:
    the engine must bring it back in that order, or it fetches on demand past the window."""
    static, saved = memory_need("bottleneck")
    budget = static + int(share * saved)
    recorder = StatsRecorder()
    model, _ = copies("bottleneck")
    trainer_for(AccUDNNStrategy(budget=budget, min_swap_bytes=0), max_steps=4, callbacks=[recorder]).fit(
        model, loader("bottleneck")
    )
    planned = [stats for stats in recorder.stats if not stats.profiling]
    assert planned
    assert all(stats.peak_device_bytes <= min(budget, stats.predicted_peak_bytes) for stats in planned)


def test_stats_are_exposed_and_logged():
    class MemoryLogger(Logger):
        name, version = "memory", 0
        experiment = None

        def __init__(self):
            super().__init__()
            self.metrics = []

        def log_metrics(self, metrics, step):
            self.metrics.append(metrics)

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    logger = MemoryLogger()
    strategy = swapping_strategy("mlp")
    model, _ = copies("mlp")
    trainer = trainer_for(strategy, max_steps=3)
    trainer.loggers = [logger]
    trainer.log_every_n_steps = 1
    trainer.fit(model, loader("mlp"))

    stats = strategy.stats
    # What is still in flight when the forward ends (at most the plan's copy-out limit beyond
    # the newest storage) is read in place in backward; everything else comes back.
    assert stats.bytes_swapped_out > 0 and 0 < stats.bytes_swapped_in <= stats.bytes_swapped_out
    largest = max(layer.swappable_bytes for layer in strategy.plan.profile.layers)
    assert stats.bytes_swapped_out - stats.bytes_swapped_in <= strategy.plan.max_copying_out_bytes + largest
    assert stats.wait_seconds >= 0 and stats.peak_device_bytes > 0
    logged = [m for m in logger.metrics if "accudnn/bytes_swapped_out" in m]
    assert len(logged) == 3
    assert {"accudnn/bytes_swapped_in", "accudnn/wait_seconds", "accudnn/peak_device_bytes"} <= set(logged[0])


@pytest.mark.parametrize("share", [0.5, None], ids=["half the activations", "ample"])
def test_an_epoch_whose_last_batch_is_short_trains_on_equal_to_plain_fit(share):
    """37 samples in batches of 8 (``drop_last=False``): each epoch ends on a batch of 5, which
    runs under the plan of the batches of 8 and is timed and planned again as the epochs go on.
    Four epochs train through and equal plain training in every bit, whether the budget makes
    the plan swap or not."""
    plain_model, swapped_model = copies("cnn")
    samples = torch.utils.data.Subset(loader("cnn", batches=5).dataset, range(37))

    def epochs() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(samples, batch_size=8, shuffle=False)

    trainer_for("auto", max_steps=-1, max_epochs=4).fit(plain_model, epochs())
    recorder = StatsRecorder()
    if share is None:
        strategy = AccUDNNStrategy(budget="8GB", min_swap_bytes=0)
    else:
        strategy = swapping_strategy("cnn", share)
    trainer_for(strategy, max_steps=-1, max_epochs=4, callbacks=[recorder]).fit(swapped_model, epochs())

    assert len(recorder.stats) == 4 * 5
    assert (share is None) != any(stats.bytes_swapped_out > 0 for stats in recorder.stats[1:])
    for (name, a), b in zip(
        plain_model.state_dict().items(), swapped_model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"{name} differs"
