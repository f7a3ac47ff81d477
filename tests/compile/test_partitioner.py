"""Experimental whole-model route: a plan applied in the partitioner (PyTorch 2.14.1)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import make_boxed_func
from torch._inductor.utils import fresh_cache

from lightning_accudnn.compile import PlanPartitioner, offloading_options, plan_choices, profile_of
from lightning_accudnn.planner.plan import plan_swaps
from lightning_accudnn.profile import LayerChoice
from tests.compile.helpers import Net, backend_param, batches, loss_of

SWAP, KEEP, RECOMPUTE = LayerChoice.SWAP, LayerChoice.KEEP, LayerChoice.RECOMPUTE
PLAN = {"stem": KEEP, "blocks.0": SWAP, "blocks.1": RECOMPUTE, "head": KEEP}


def _aot_eager(partitioner: PlanPartitioner):
    """aot_eager (no kernel compiler) with ``partitioner`` as the partition function."""

    def nop(gm, _inputs):
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=partitioner)


def _compile(model, partitioner, backend):
    if backend == "inductor":
        return torch.compile(model, backend="inductor", options={"custom_partitioner_fn": partitioner})
    return torch.compile(model, backend=_aot_eager(partitioner))


def _grads(model, compiled=None, saves=None):
    batch = batches(1)[0]
    model.zero_grad(set_to_none=True)
    with (
        torch._functorch.config.patch(offloading_options(accelerator=False)),
        torch.autograd.graph.saved_tensors_hooks(lambda t: saves.append(t) or t, lambda t: t)
        if saves is not None
        else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
    ):
        loss = loss_of(compiled if compiled is not None else model, batch)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager"])  # Inductor: in the cache test below
def test_the_nodes_tagged_are_the_plans_choices_and_gradients_equal_eager(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    expected = _grads(model)
    trial = PlanPartitioner({})
    _grads(model, _compile(model, trial, backend))
    partitioner = PlanPartitioner(PLAN)
    torch._dynamo.reset()
    actual = _grads(model, _compile(model, partitioner, backend))

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
        if backend == "aot_eager":
            assert torch.equal(want, got)
        else:  # Inductor's fused kernels round differently from eager
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_trial_partition_plans_with_the_projects_planner():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    trial = PlanPartitioner({})
    _grads(model, _compile(model, trial, "aot_eager"))
    profile = profile_of(trial.partitions[0], static_bytes=10_000)
    assert {"blocks.0.up", "blocks.1.up"} <= {layer.name for layer in profile.layers}
    budget = profile.static_bytes + profile.saved_bytes // 2
    choices = plan_choices(plan_swaps(profile, budget))
    assert set(choices) == {layer.name for layer in profile.layers}
    assert SWAP in choices.values() and KEEP in choices.values()


@pytest.mark.slow
@pytest.mark.parametrize("backend", [backend_param("inductor")])
def test_the_compile_cache_is_keyed_by_the_plan(backend):
    plan_a = {"blocks.0": KEEP, "blocks.1": RECOMPUTE}
    plan_b = {"blocks.0": KEEP, "blocks.1": KEEP}
    torch.manual_seed(0)
    model = Net()
    expected = _grads(model)
    seen = []
    with fresh_cache():
        for plan in (plan_a, plan_b, plan_a):
            torch._dynamo.reset()
            counters.clear()
            partitioner = PlanPartitioner(plan)
            saves = []
            grads = _grads(model, _compile(model, partitioner, backend), saves)
            hits, misses = (
                counters["aot_autograd"]["autograd_cache_hit"],
                counters["aot_autograd"]["autograd_cache_miss"],
            )
            seen.append(("hit" if hits and not misses else "miss", len(saves), len(partitioner.partitions)))
            for want, got in zip(expected, grads, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (a_first, a_saves, a_calls), (b_first, b_saves, b_calls), (a_again, a_saves_again, a_calls_again) = seen
    assert (a_first, b_first, a_again) == ("miss", "miss", "hit"), seen
    assert (a_calls, b_calls, a_calls_again) == (1, 1, 0), seen  # a hit never runs the partitioner
    assert a_saves < b_saves and a_saves_again == a_saves, seen  # each run saves what its plan says
