"""Trainers and measurements shared by the strategy tests."""

from __future__ import annotations

import copy

import torch
from lightning.pytorch import Callback, Trainer

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.profiling.static_memory import model_state_bytes
from tests.models import Classifier, loss_of, make_batch


class StatsRecorder(Callback):
    """Keeps ``strategy.stats`` and the plan after every training batch."""

    def __init__(self) -> None:
        self.stats = []
        self.plans = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.stats.append(trainer.strategy.stats)
        self.plans.append(trainer.strategy.plan)


def trainer_for(strategy, max_steps: int = 4, callbacks=(), **overrides) -> Trainer:
    """A quiet, deterministic Trainer on one CPU unless ``overrides`` say otherwise."""
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "deterministic": True,
    }
    return Trainer(
        strategy=strategy,
        max_steps=max_steps,
        callbacks=list(callbacks),
        **(options | overrides),
    )


def memory_need(kind: str, batch_size: int = 8) -> tuple[int, int]:
    """(model state with SGD momentum, saved activations) of one step, measured by the engine."""
    module = Classifier(kind)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(module, SwapSchedule.keep_everything()):
        loss = loss_of(module.model, make_batch(kind, batch_size))
    loss.backward()
    saved = sum(layer.saved_bytes for layer in engine.end_step().layers)
    optimizer.step()
    return model_state_bytes(module, [optimizer]), saved


def swapping_strategy(kind: str, share_of_activations: float = 0.5, **kwargs) -> AccUDNNStrategy:
    """A strategy whose budget holds the model state and only a share of the activations."""
    static, saved = memory_need(kind)
    return AccUDNNStrategy(budget=static + int(share_of_activations * saved), min_swap_bytes=0, **kwargs)


def copies(kind: str) -> tuple[Classifier, Classifier]:
    torch.manual_seed(0)
    model = Classifier(kind)
    return model, copy.deepcopy(model)
