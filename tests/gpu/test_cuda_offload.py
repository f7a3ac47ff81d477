"""On a CUDA GPU: equal gradients with copy streams, and the allocator kept within the budget."""

import copy

import pytest
import torch
from lightning.pytorch import Trainer
from torch import nn

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.session import OffloadConfig, OffloadSession
from tests.models import Classifier, loss_of, make_batch, make_model

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("deterministic_cuda")]


@pytest.mark.parametrize("kind", ["cnn", "gpt"])
@pytest.mark.parametrize("window", [0, 2**20, 2**40])
def test_gradients_bitwise_equal_on_cuda_with_streams(kind, window):
    device = torch.device("cuda")
    torch.manual_seed(0)
    reference = make_model(kind).to(device)
    swapped = copy.deepcopy(reference)
    engine = OffloadEngine(device, min_swap_bytes=0)
    assert type(engine.runtime).__name__ == "CudaRuntime"
    for seed in range(3):
        batch = tuple(t.to(device) for t in make_batch(kind, batch_size=32, seed=seed))
        reference.zero_grad()
        swapped.zero_grad()
        loss_of(reference, batch).backward()
        with engine.offload(swapped, SwapSchedule.swap_everything(window, max_copying_out_bytes=2**22)):
            loss = loss_of(swapped, batch)
        loss.backward()
        stats = engine.end_step()
        assert stats.bytes_swapped_out > 0
        for a, b in zip(reference.parameters(), swapped.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad)
    assert engine.pool.in_use_bytes == 0
    engine.close()


class WideConvNet(Classifier):
    """Convolutions at full resolution: activations dwarf the weights."""

    def __init__(self, depth: int = 16, channels: int = 64) -> None:
        super().__init__("cnn")
        layers = [nn.Conv2d(3, channels, 3, padding=1)]
        for _ in range(depth):
            layers += [
                nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU(),
            ]
        self.model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))


def _data(batch_size=16, size=128, steps=4):
    images = torch.randn(batch_size * steps, 3, size, size)
    labels = torch.randint(0, 10, (batch_size * steps,))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=batch_size)


def test_reserved_memory_within_a_budget_a_third_of_the_need():
    device = torch.device("cuda")
    module = WideConvNet().to(device)
    optimizer = module.configure_optimizers()
    images, labels = next(iter(_data()))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss_of(module.model, (images.to(device), labels.to(device))).backward()
    optimizer.step()
    need = torch.cuda.max_memory_allocated() - base + sum(p.nbytes for p in module.parameters())
    del module, optimizer
    torch.cuda.empty_cache()

    budget = need // 3
    strategy = AccUDNNStrategy(budget=budget)
    trainer = Trainer(
        accelerator="gpu", devices=1, strategy=strategy, max_steps=4, logger=False, enable_checkpointing=False
    )
    torch.cuda.reset_peak_memory_stats()
    trainer.fit(WideConvNet(), _data())
    assert strategy.stats.bytes_swapped_out > 0
    assert torch.cuda.max_memory_reserved() <= budget


def test_a_session_on_a_bare_cuda_device_caps_its_allocator():
    """``OffloadSession(config, "cuda")`` as examples/plain_loop.py makes it (not yet run on a GPU:
    written after the H100 lent on 2026-11-23 showed the bare device refused)."""
    model = make_model("cnn").cuda()
    session = OffloadSession(OffloadConfig(budget="50%", min_swap_bytes=0), "cuda")
    assert session.device.index == torch.cuda.current_device()
    batch = tuple(t.cuda() for t in make_batch("cnn", batch_size=8, seed=0))
    with session.step(model):
        loss = loss_of(model, batch)
    loss.backward()
    assert session.stats is not None and session.stats.peak_device_bytes > 0
    session.close()
