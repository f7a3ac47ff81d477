"""``Trainer.fit`` with the strategy on a simulated GPU: equal to plain Lightning at every lag,
no ordering violation, and every planned step within the memory its plan predicted."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.testing import SimulatedGPU
from tests.models import loader
from tests.recompute.models import forcing_search
from tests.strategy.helpers import copies, swapping_strategy, trainer_for


class SimulatedPeaks(Callback):
    """After each training batch: the simulated GPU's held peak (activations the engine held,
    in issue order) beside the plan the step ran under; then the peaks restart."""

    def __init__(self, gpu: SimulatedGPU) -> None:
        self.gpu = gpu
        self.steps: list[tuple[int, object]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        stats = trainer.strategy.stats
        self.steps.append((self.gpu.peak_held_bytes, None if stats.profiling else stats))
        self.gpu.reset_peaks()


@pytest.mark.parametrize("lag", [0, 8, None])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_fit_on_a_simulated_gpu_equals_plain_lightning(kind, lag):
    plain_model, swapped_model = copies(kind)
    trainer_for("auto").fit(plain_model, loader(kind))

    gpu = SimulatedGPU(lag=lag, seed=7)
    peaks = SimulatedPeaks(gpu)
    strategy = swapping_strategy(kind, runtime=gpu)
    trainer_for(strategy, callbacks=[peaks]).fit(swapped_model, loader(kind))

    assert gpu.violations == []
    assert strategy.plan is not None and strategy.plan.swapped_layers, "the budget should force swapping"
    planned = [(held, stats) for held, stats in peaks.steps if stats is not None]
    assert planned, "steps after the profiling step run a plan"
    static = strategy.plan.profile.static_bytes
    for held, stats in planned:
        # The plan's prediction is static memory plus activations, in issue order: the same
        # bytes the simulated GPU saw held, however late its copies completed.
        assert static + held <= stats.predicted_peak_bytes
    for (name, a), b in zip(
        plain_model.state_dict().items(), swapped_model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"{name} differs at lag {lag}"


@pytest.mark.parametrize("lag", [0, 3, None])
def test_passes_observed_only_up_to_their_last_swap_equal_plain_lightning(lag):
    """Between observed passes a swapping plan's hooks go after its last swapped save:
    those steps swap the same, order their copies the same and train bitwise the same."""
    plain_model, swapped_model = copies("cnn")
    trainer_for("auto", max_steps=8).fit(plain_model, loader("cnn", batches=8))

    gpu = SimulatedGPU(lag=lag, seed=11)
    peaks = SimulatedPeaks(gpu)
    strategy = swapping_strategy("cnn", runtime=gpu, policy="swap", observe_every=4)
    trainer_for(strategy, max_steps=8, callbacks=[peaks]).fit(swapped_model, loader("cnn", batches=8))

    assert gpu.violations == []
    planned = [stats for _, stats in peaks.steps if stats is not None]
    partial = [stats for stats in planned if not stats.observed]
    assert partial and all(stats.bytes_swapped_out > 0 for stats in partial), [
        (stats.observed, stats.bytes_swapped_out) for stats in planned
    ]
    for (name, a), b in zip(
        plain_model.state_dict().items(), swapped_model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"{name} differs at lag {lag}"


@pytest.mark.parametrize("lag", [0, 3, None])
def test_fits_that_recompute_and_swap_drop_the_hooks_after_their_last_swap_and_equal_plain_lightning(
    lag, monkeypatch
):
    """Through the strategy (the plan forced, at an ample budget), a plan recomputing a block
    whole and swapping the block before it: the steps between observed ones swap, take the hooks
    out after the last swapped save and recompute with none, order their copies and train
    bitwise like plain Lightning."""
    monkeypatch.setattr(
        planner_plan,
        "search_mixed",
        forcing_search(("model.blocks.1",), ("model.blocks.0.bn1", "model.blocks.0.relu")),
    )
    plain_model, trained_model = copies("cnn")
    trainer_for("auto", max_steps=8).fit(plain_model, loader("cnn", batches=8))

    gpu = SimulatedGPU(lag=lag, seed=11)
    peaks = SimulatedPeaks(gpu)
    strategy = AccUDNNStrategy(
        budget=10**9, min_swap_bytes=0, runtime=gpu, policy="recompute", observe_every=4
    )
    trainer_for(strategy, max_steps=8, callbacks=[peaks]).fit(trained_model, loader("cnn", batches=8))

    assert gpu.violations == []
    planned = [stats for _, stats in peaks.steps if stats is not None]
    assert all(stats.bytes_swapped_out > 0 for stats in planned)
    assert any(not stats.observed for stats in planned), [stats.observed for stats in planned]
    assert strategy.plan is not None and strategy.plan.recomputed == ("model.blocks.1",)
    for (name, a), b in zip(
        plain_model.state_dict().items(), trained_model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), f"{name} differs at lag {lag}"
