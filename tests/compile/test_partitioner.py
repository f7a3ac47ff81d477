"""Experimental whole-model route: a plan applied in the partitioner (PyTorch 2.14.1)."""

from __future__ import annotations

import pytest
import torch

from lightning_accudnn.planner.plan import plan_swaps
from lightning_accudnn.profile import LayerChoice
from lightning_accudnn.whole_model_compile import (
    TRIAL_PLAN,
    PlanBackend,
    PlanPartitioner,
    plan_choices,
    profile_of,
)
from tests.compile.helpers import Net, batches, loss_of

SWAP, KEEP, RECOMPUTE = LayerChoice.SWAP, LayerChoice.KEEP, LayerChoice.RECOMPUTE
PLAN = {"stem": KEEP, "blocks.0": SWAP, "blocks.1": RECOMPUTE, "head": KEEP}


def _compile(model, partitioner):
    """``model`` compiled with aot_eager (no kernel compiler) and ``partitioner``; the offload
    pass is on when its plan swaps (see ``PlanBackend``)."""
    return torch.compile(model, backend=PlanBackend(partitioner, "aot_eager"))


def _grads(model, compiled=None):
    model.zero_grad(set_to_none=True)
    loss_of(compiled if compiled is not None else model, batches(1)[0]).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
def test_the_nodes_tagged_are_the_plans_choices_and_gradients_equal_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    expected = _grads(model)
    trial = PlanPartitioner({})
    _grads(model, _compile(model, trial))
    partitioner = PlanPartitioner(PLAN)
    torch._dynamo.reset()
    actual = _grads(model, _compile(model, partitioner))

    (untagged,) = trial.partitions
    (partition,) = partitioner.partitions
    assert untagged.offloaded == untagged.recomputed == {} and untagged.saved_bytes.get("blocks.1.up", 0) > 0
    assert set(partition.offloaded) == {"blocks.0"} and set(partition.recomputed) == {"blocks.1"}
    # What the tags did: blocks.0's saved activations go through the offload pass; blocks.1
    # saves nothing of its own (its forward runs again in backward from its input).
    assert partition.saved_offloaded, "the offload pass should take some of blocks.0's saved activations"
    assert all(layer.startswith("blocks.0") for layer in partition.saved_offloaded), partition.saved_offloaded
    assert not any(layer.startswith("blocks.1") for layer in partition.saved_bytes), partition.saved_bytes
    for want, got in zip(expected, actual, strict=True):
        assert torch.equal(want, got)


def test_the_trial_partition_plans_with_the_projects_planner():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    expected = _grads(model)
    trial = PlanPartitioner(TRIAL_PLAN)
    actual = _grads(model, _compile(model, trial))
    assert all(torch.equal(a, b) for a, b in zip(expected, actual, strict=True))
    (partition,) = trial.partitions
    # Every activation the offload pass can move was offloaded, and counted in its own layer.
    assert partition.offloaded_bytes["blocks.0.up"] == partition.saved_bytes["blocks.0.up"] > 0
    profile = profile_of(partition, static_bytes=10_000)
    swappable = {layer.name: layer.swappable_bytes for layer in profile.layers}
    assert swappable["blocks.0.up"] > 0 and swappable["blocks.0.norm"] == 0  # its saved statistics stay
    smallest = plan_swaps(profile, profile.unconstrained_peak_bytes).min_budget_bytes
    budget = smallest + (profile.unconstrained_peak_bytes - smallest) // 4
    choices = plan_choices(plan_swaps(profile, budget))
    assert set(choices) == {layer.name for layer in profile.layers}
    assert SWAP in choices.values() and KEEP in choices.values()
