"""On a CUDA GPU: DDP with one process and swapping trains exactly like Lightning's DDP.

Not like the single-device strategy: Lightning's own one-process DDP is not bitwise equal to its
single-device training (on CPU too); AccUDNNDDPStrategy matches DDPStrategy bitwise on CPU. On
the GPU Lightning's DDP trains under the strategy's allocator cap (:mod:`tests.gpu.allocator_cap`
says why)."""

import os

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_accudnn import AccUDNNDDPStrategy
from tests.gpu.allocator_cap import allocator_capped
from tests.gpu.budgets import halfway_budget
from tests.models import Classifier, loader
from tests.strategy.helpers import trainer_for

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]


def _fit(strategy, model):
    trainer = trainer_for(strategy, accelerator="gpu")
    trainer.fit(model, loader("cnn", batches=4, batch_size=256))
    return strategy


@pytest.mark.skipif(
    bool(os.environ.get("TORCH_CUDA_SANITIZER")),
    reason="the CUDA sanitizer reports a race inside DistributedDataParallel's own constructor "
    "(_sync_params_and_buffers), in the plain DDPStrategy fit, before any swapping (H100, torch 2.11, "
    "2026-11-23)",
)
def test_one_process_ddp_with_swapping_matches_lightnings_ddp():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    plain, swapped, probe = Classifier("cnn"), Classifier("cnn"), Classifier("cnn")
    swapped.load_state_dict(plain.state_dict())
    probe.load_state_dict(plain.state_dict())
    options = {"reserve_bytes": 128 * 2**20, "min_swap_bytes": 0, "policy": "swap"}
    budget = halfway_budget(_fit(AccUDNNDDPStrategy(budget="90%", **options), probe).plan)
    with allocator_capped(budget):
        _fit(DDPStrategy(), plain)
    strategy = _fit(AccUDNNDDPStrategy(budget=budget, **options), swapped)
    assert strategy.stats.bytes_swapped_out > 0
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b.cpu()), f"{name} differs"
