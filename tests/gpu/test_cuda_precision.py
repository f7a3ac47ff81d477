"""On a CUDA GPU: mixed precision (with fp16's grad scaler) and compile with the strategy."""

import copy

import pytest
import torch

from lightning_accudnn import AccUDNNStrategy
from tests.gpu.allocator_cap import allocator_capped
from tests.gpu.budgets import halfway_budget
from tests.models import Classifier, loader
from tests.strategy.helpers import trainer_for

pytestmark = pytest.mark.cuda


def _fit(strategy, model, precision):
    trainer = trainer_for(strategy, accelerator="gpu", precision=precision)
    trainer.fit(model, loader("cnn", batches=4, batch_size=256))


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
def test_mixed_precision_with_swapping_matches_plain_training(precision):
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    plain = Classifier("cnn")
    swapped, probe = copy.deepcopy(plain), copy.deepcopy(plain)
    options = {"reserve_bytes": 128 * 2**20, "min_swap_bytes": 0, "policy": "swap"}
    ample = AccUDNNStrategy(budget="90%", **options)
    _fit(ample, probe, precision)
    budget = halfway_budget(ample.plan)
    with allocator_capped(budget):  # the same cap as the strategy's (see tests.gpu.allocator_cap)
        _fit("auto", plain, precision)
    strategy = AccUDNNStrategy(budget=budget, **options)
    _fit(strategy, swapped, precision)
    assert strategy.stats.bytes_swapped_out > 0 or strategy.plan.swapped_layers
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a.cpu(), b.cpu()), f"{name} differs"


def test_compiled_module_is_refused_on_cuda():
    with pytest.raises(ValueError, match="torch.compile"):
        _fit(AccUDNNStrategy(budget="50%"), torch.compile(Classifier("cnn")), "32-true")
