"""A model with a controllable throughput curve, and trainers and recorders for the tuner tests.

Training batches "take" ``curve(batch_size)`` seconds on a :class:`VirtualClock` that the
tuner reads instead of the wall clock, so measured throughputs are exact and the tests do
not depend on how busy the machine is.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from torch import nn

from lightning_accudnn import EfficiencyTuner


class VirtualClock:
    """Seconds that pass only when a training batch says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Peaked:
    """Seconds per batch ``s * (1 + (b / best)^2)``: throughput ``b / t(b)`` peaks at ``best``."""

    best: int = 16
    seconds: float = 0.01

    def __call__(self, batch_size: int) -> float:
        return self.seconds * (1.0 + (batch_size / self.best) ** 2)


@dataclass(frozen=True)
class Flat:
    """Every batch takes the same time: throughput grows with the batch size."""

    seconds: float = 0.01

    def __call__(self, batch_size: int) -> float:
        return self.seconds


def peaked(best: int = 16, seconds: float = 0.01) -> Peaked:
    return Peaked(best, seconds)


def flat(seconds: float = 0.01) -> Flat:
    return Flat(seconds)


def dataset(samples: int = 512, features: int = 8, seed: int = 0) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, features, generator=generator)
    targets = (inputs[:, 0] > 0).long()
    return torch.utils.data.TensorDataset(inputs, targets)


class CurveModel(LightningModule):
    """A small classifier; ``clock`` (if given) advances by ``curve(batch)`` every training batch.

    ``scheduler``: ``None``, ``"steplr"`` (per epoch), ``"cosine"`` or ``"onecycle"`` (per
    step, lengths from ``trainer.estimated_stepping_batches``).
    """

    def __init__(
        self,
        batch_size: int = 4,
        lr: float = 0.1,
        optimizer: str = "sgd",
        scheduler: str | None = None,
        samples: int = 512,
        hidden: int = 16,
        clock: VirtualClock | None = None,
        curve: Callable[[int], float] | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.lr = lr
        self.optimizer_name = optimizer
        self.scheduler_name = scheduler
        self.samples = samples
        self.clock = clock
        self.curve = curve or peaked()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.batches_seen: Counter[int] = Counter()

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        self.batches_seen[inputs.shape[0]] += 1
        if self.clock is not None:
            self.clock.advance(self.curve(inputs.shape[0]))
        return F.cross_entropy(self.net(inputs), targets)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(dataset(self.samples), batch_size=self.batch_size, shuffle=True)

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if self.scheduler_name is None:
            return optimizer
        if self.scheduler_name == "steplr":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
        total = int(self.trainer.estimated_stepping_batches)
        schedulers = torch.optim.lr_scheduler
        if self.scheduler_name == "cosine":
            scheduler = schedulers.CosineAnnealingLR(optimizer, T_max=total, eta_min=self.lr / 100)
        else:
            scheduler = schedulers.OneCycleLR(optimizer, max_lr=self.lr, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class DataModule(LightningDataModule):
    def __init__(self, batch_size: int = 4, samples: int = 512) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.batch_size = batch_size

    def train_dataloader(self):
        return torch.utils.data.DataLoader(dataset(self.hparams.samples), batch_size=self.batch_size)


class LrRecorder(Callback):
    """The learning rate each optimizer step used (read inside ``optimizer.step``), and batch sizes.

    Put it after the tuner: its step hook then runs after the tuner's warmup hook.
    """

    def __init__(self) -> None:
        self.used: list[float] = []
        self.batch_sizes: list[int] = []
        self._handle = None

    def on_train_start(self, trainer, pl_module) -> None:
        def record(optimizer, args, kwargs):
            self.used.append(optimizer.param_groups[0]["lr"])

        self._handle = trainer.optimizers[0].register_step_pre_hook(record)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batch_sizes.append(batch[0].shape[0])

    def on_train_end(self, trainer, pl_module) -> None:
        self._handle.remove()


def tuner_trainer(tuner: EfficiencyTuner | None, callbacks=(), **overrides) -> Trainer:
    """A quiet CPU Trainer with the tuner first among its callbacks."""
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 4,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    chosen = [tuner] if tuner is not None else []
    return Trainer(callbacks=[*chosen, *callbacks], **(options | overrides))


def rng_state() -> tuple:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
