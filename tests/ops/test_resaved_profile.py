"""The engine reports storages saved again by later layers (``LayerProfile.resaved_by``), so
that plans made from its profile bound its ledger whatever the timings choose.

In a Bottleneck a block's input is saved by the previous block's last ReLU and again by the
first convolution and the downsample; BatchNorm's output is saved again by the ReLU after it.
Without ``resaved_by`` the planner counts such a storage as back on the device only from its
first saver's backward, and the ledger passed plans' predicted peaks by up to 245,696 bytes
on this model."""

import dataclasses
import random

import pytest
import torch

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.planner.plan import BudgetTooSmallError, plan_swaps
from lightning_accudnn.profile import StepProfile
from tests.models import Classifier, loss_of, make_batch


def _step(engine, model, batch, schedule):
    with engine.offload(model, schedule):
        loss = loss_of(model, batch)
    loss.backward()
    return engine.end_step()


def test_the_profile_names_resaved_storages_under_a_layer_of_the_profile():
    model, batch = Classifier("bottleneck").model, make_batch("bottleneck", 8)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    layers = _step(engine, model, batch, SwapSchedule.keep_everything()).layers
    names = [layer.name for layer in layers]
    resaved = [(layer, later, nbytes) for layer in layers for later, nbytes in layer.resaved_by]
    assert resaved
    for layer, later, nbytes in resaved:
        assert names.index(later) > names.index(layer.name)
        assert 0 < nbytes <= layer.swappable_bytes


@pytest.mark.parametrize("seed", range(3))
def test_plans_from_the_engine_profile_bound_its_ledger_under_any_timings(seed):
    torch.manual_seed(0)
    model, batch = Classifier("bottleneck").model, make_batch("bottleneck", 8)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    layers = _step(engine, model, batch, SwapSchedule.keep_everything()).layers
    saved = sum(layer.saved_bytes for layer in layers)
    rng = random.Random(seed)
    planned = 0
    for _ in range(8):
        timed = tuple(
            dataclasses.replace(
                layer, forward_seconds=rng.uniform(1e-4, 1e-2), backward_seconds=rng.uniform(1e-4, 2e-2)
            )
            for layer in layers
        )
        d2h, h2d = rng.choice([1e6, 1e8, 1e10]), rng.choice([1e6, 1e8, 1e10])
        profile = StepProfile(timed, static_bytes=0, d2h_bytes_per_second=d2h, h2d_bytes_per_second=h2d)
        try:
            plan = plan_swaps(profile, int(rng.uniform(0.3, 0.9) * saved))
        except BudgetTooSmallError:
            continue
        schedule = SwapSchedule.swap_layers_named(
            plan.swapped_layers,
            prefetch_window_bytes=plan.prefetch_window_bytes,
            max_copying_out_bytes=plan.max_copying_out_bytes,
        )
        assert _step(engine, model, batch, schedule).ledger_peak_bytes <= plan.predicted_peak_bytes
        planned += 1
    assert planned


def test_a_resave_by_a_layer_saving_nothing_of_its_own_names_that_layer():
    """A convolution after a ReLU saves only the ReLU's output: it is no layer of the profile,
    whose ``resaved_by`` lists that re-save under the next layer that saves something, and whose
    ``resaved_by_module`` names the convolution."""
    model = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 1)),
        torch.nn.BatchNorm2d(4),
    )
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = model(torch.randn(2, 3, 8, 8)).square().sum()
    loss.backward()
    layers = {layer.name: layer for layer in engine.end_step().layers}
    assert "0.2" not in layers
    relu = layers["0.1"]
    assert relu.resaved_by == (("1", 2 * 4 * 8 * 8 * 4),)
    assert relu.resaved_by_module == (("0.2", 2 * 4 * 8 * 8 * 4),)
    assert not any(layer.resaved_by_module for name, layer in layers.items() if name != "0.1")
    engine.close()
