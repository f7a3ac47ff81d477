"""Regional compilation under both Lightning strategies: the same weights as plain Lightning,
bit for bit, with swapping in the plan, or with compiled blocks recomputed (policy
``"recompute"`` at its least budget); on a simulated GPU at two lags with no ordering
violation; each block compiled once over the whole fit."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import DDPStrategy

from lightning_accudnn import AccUDNNDDPStrategy, AccUDNNStrategy
from lightning_accudnn.testing import SimulatedGPU
from tests.compile.helpers import (
    CompileCounts,
    batches,
    compiled_net,
    count_compiled_calls,
    loss_of,
    recompute_budget,
    tight_budget,
)
from tests.strategy.helpers import trainer_for

STEPS = 4


class CompiledClassifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = compiled_net("aot_eager", "block.compile()")

    def training_step(self, batch, batch_idx):
        return loss_of(self.net, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loader():
    return torch.utils.data.DataLoader(batches(STEPS), batch_size=None)


def _end_process_group() -> None:
    """DDP in this process leaves its (one-rank) process group behind: end it, or the spawned
    DDP tests that run later in this process find one already initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module", autouse=True)
def launcher_environment_restored():
    """Lightning's DDP launcher exports LOCAL_RANK, WORLD_SIZE, MASTER_PORT and the like into
    this process; left behind, they make the DDP scripts later tests launch believe they were
    started by an outside launcher (and wait for ranks that never come): take them back."""
    saved = dict(os.environ)
    yield
    _end_process_group()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    _end_process_group()


@pytest.fixture(scope="module")
def plain_weights():
    """Initial weights, and the weights plain Lightning (one device; DDP in one process) trains."""
    torch._dynamo.reset()
    initial = copy.deepcopy(CompiledClassifier().state_dict())
    trained = {}
    for kind, strategy in (("single", "auto"), ("ddp", DDPStrategy())):
        module = CompiledClassifier()
        module.load_state_dict(initial)
        trainer_for(strategy, max_steps=STEPS).fit(module, _loader())
        _end_process_group()
        trained[kind] = module.state_dict()
    return initial, trained


def _strategy(kind: str, lag: object, policy: str):
    """The strategy under test: policy swap at a budget that forces swapping, or policy recompute
    at the least budget it plans at (a compiled block recomputed)."""
    net = compiled_net("aot_eager", "block.compile()")
    budget = tight_budget(net) if policy == "swap" else recompute_budget(net)
    if kind == "ddp":  # one process; DDP's gradient buckets (as large as the parameters) are model state
        buckets = sum(p.numel() * p.element_size() for p in net.parameters())
        return AccUDNNDDPStrategy(budget=budget + buckets, min_swap_bytes=0, policy=policy), None
    gpu = SimulatedGPU(lag=lag, seed=3)
    return AccUDNNStrategy(budget=budget, min_swap_bytes=0, policy=policy, runtime=gpu), gpu


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["swap", "recompute"])
@pytest.mark.parametrize(
    ("kind", "lag"), [("single", 0), ("single", None), ("ddp", "cpu")], ids=["lag 0", "unbounded lag", "ddp"]
)
def test_a_regionally_compiled_model_fits_like_plain_lightning(plain_weights, kind, lag, policy):
    initial, trained = plain_weights
    expected = trained[kind]
    strategy, gpu = _strategy(kind, lag, policy)
    module = CompiledClassifier()
    module.load_state_dict(initial)
    blocks = ("net.blocks.0", "net.blocks.1")
    runs = {name: count_compiled_calls(module.get_submodule(name)) for name in blocks}
    counts = CompileCounts.during(lambda: trainer_for(strategy, max_steps=STEPS).fit(module, _loader()))

    if gpu is not None:
        assert gpu.violations == []
    plan = strategy.plan
    assert plan is not None and set(blocks) <= {layer.name for layer in plan.profile.layers}
    if policy == "swap":
        assert plan.swapped_layers, "the budget should force swapping"
        assert all(counter == [STEPS] for counter in runs.values()), runs
    else:  # every pass but the profiling one recomputes: a recomputed block's code runs again in backward
        assert plan.recomputed and set(plan.recomputed) <= set(blocks), plan.recomputed
        assert not plan.swapped_layers
        for name, counter in runs.items():
            assert counter == [2 * STEPS - 1 if name in plan.recomputed else STEPS], runs
    assert counts.graph_breaks == 0 and counts.recompiles == 0 and counts.frames <= 1, counts
    for name, value in expected.items():
        assert torch.equal(value, module.state_dict()[name]), f"{name} differs"
