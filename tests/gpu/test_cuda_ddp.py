"""On a CUDA GPU: DDP with one process trains exactly like the single-device strategy."""

import pytest
import torch

from lightning_accudnn import AccUDNNDDPStrategy, AccUDNNStrategy
from tests.models import Classifier, loader
from tests.strategy.helpers import memory_need, trainer_for

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]


def _fit(strategy, model):
    trainer = trainer_for(strategy, accelerator="gpu")
    trainer.fit(model, loader("cnn", batches=4, batch_size=256))
    return strategy


def test_one_process_ddp_matches_the_single_device_strategy():
    torch.manual_seed(0)
    single, distributed = Classifier("cnn"), Classifier("cnn")
    distributed.load_state_dict(single.state_dict())
    # Half the activations (fp32 byte counts are the same on CPU and GPU), plus room for
    # what the allocator holds besides saved activations (activation gradients, workspaces).
    static, saved = memory_need("cnn", batch_size=256)
    slack = 128 * 2**20
    options = {"budget": static + saved // 2 + slack, "reserve_bytes": slack, "min_swap_bytes": 0}
    single_strategy = _fit(AccUDNNStrategy(**options), single)
    ddp_strategy = _fit(AccUDNNDDPStrategy(**options), distributed)
    assert single_strategy.stats.bytes_swapped_out > 0
    assert ddp_strategy.stats.bytes_swapped_out == single_strategy.stats.bytes_swapped_out
    for (name, a), b in zip(single.state_dict().items(), distributed.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b.cpu()), f"{name} differs"
