"""The plan follows the workload: a new batch shape is planned from the scaled profile, then
refined from its own measurements; a refined plan uses timings."""

import torch

from lightning_accudnn import AccUDNNStrategy
from tests.models import make_batch
from tests.strategy.helpers import StatsRecorder, copies, memory_need, trainer_for


def _loader_with_batch_sizes(sizes):
    """A loader whose batches have the given sizes, in order."""
    batches = [make_batch("cnn", batch_size=size, seed=i) for i, size in enumerate(sizes)]
    return torch.utils.data.DataLoader(batches, batch_size=None)


def test_changed_batch_size_is_planned_from_the_scaled_profile_not_profiled_and_replans():
    static, saved = memory_need("cnn", batch_size=8)
    budget = static + int(0.6 * saved)
    recorder = StatsRecorder()
    # Plans made at the end of their pass: which plan each pass runs is what is checked.
    strategy = AccUDNNStrategy(budget=budget, min_swap_bytes=0, plan_in_background=False)
    model, _ = copies("cnn")
    trainer_for(strategy, max_steps=6, callbacks=[recorder]).fit(
        model, _loader_with_batch_sizes([8, 8, 8, 3, 3, 3])
    )

    sources = [stats.plan_source.value for stats in recorder.stats]
    assert sources == ["profiling", "profiled", "refined", "scaled", "refined", "refined"]
    big, small = recorder.plans[2], recorder.plans[5]
    assert big.profile.saved_bytes > 1.9 * small.profile.saved_bytes  # activations scale with the batch
    assert small.swapped_bytes < big.swapped_bytes
    assert all(stats.peak_device_bytes <= budget for stats in recorder.stats)


def test_plans_carry_measured_times_and_predictions_are_compared():
    recorder = StatsRecorder()
    static, saved = memory_need("cnn")
    strategy = AccUDNNStrategy(budget=static + saved // 2, min_swap_bytes=0)
    model, _ = copies("cnn")
    trainer_for(strategy, max_steps=3, callbacks=[recorder]).fit(model, _loader_with_batch_sizes([8, 8, 8]))

    plan = strategy.plan
    assert all(layer.forward_seconds > 0 for layer in plan.profile.layers)
    assert sum(layer.backward_seconds for layer in plan.profile.layers) > 0
    assert 0 < plan.profile.d2h_bytes_per_second < float("inf")
    last = recorder.stats[-1]
    assert last.predicted_peak_bytes is not None and last.peak_error is not None
    assert last.step_seconds > 0 and last.step_time_error is not None
    assert torch.isfinite(torch.tensor(last.step_time_error))
    text = str(plan)
    assert all(layer.name in text for layer in plan.profile.layers)
