"""Every Python example of the README runs, on CPU.

The blocks are executed as written, with three substitutions that put them on this machine:
the GPU becomes the CPU (``accelerator="gpu"``/``"cuda"``), the Trainer stops after two steps
and stays quiet, and the names a block leaves to the reader (``model``, ``dm``, ``loader``,
``optimizer``, ``loss_fn``) are bound to a small classifier and its data.
"""

from __future__ import annotations

import re
from pathlib import Path

import lightning.pytorch
import pytest
import torch
from lightning.fabric import Fabric
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.MULTILINE | re.DOTALL)


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(64, 32, generator=generator), torch.randint(0, 4, (64,))
    )


class Data(LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 8

    def train_dataloader(self):
        return torch.utils.data.DataLoader(dataset(), batch_size=self.batch_size)


def on_cpu(source: str) -> str:
    source = source.replace('accelerator="gpu"', 'accelerator="cpu"').replace(
        'accelerator="cuda"', 'accelerator="cpu"'
    )
    return source.replace('torch.device("cuda")', 'torch.device("cpu")')


def quick_trainer(**options):
    quiet = {"max_steps": 2, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    if options.get("devices", 1) != 1 or "num_nodes" in options:  # a multi-GPU example: build, don't fit
        options |= {"devices": 2, "num_nodes": 1}
    return lightning.pytorch.trainer.trainer.Trainer(**(quiet | options))


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i + 1}")
def test_readme_example_runs_on_cpu(index, monkeypatch):
    monkeypatch.setattr(lightning.pytorch, "Trainer", quick_trainer)
    model = Model()
    namespace = {
        "Trainer": quick_trainer,
        "Fabric": Fabric,
        "model": model,
        "dm": Data(),
        "loader": torch.utils.data.DataLoader(dataset(), batch_size=8),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": nn.functional.cross_entropy,
        "torch": torch,
    }
    if "OffloadSession" in BLOCKS[index]:
        from lightning_accudnn import OffloadConfig, OffloadSession

        namespace |= {"OffloadConfig": OffloadConfig, "OffloadSession": OffloadSession}
        namespace["model"] = model.net
        namespace["optimizer"] = torch.optim.SGD(model.net.parameters(), lr=0.1)
    exec(compile(on_cpu(BLOCKS[index]), f"README.md block {index + 1}", "exec"), namespace)
