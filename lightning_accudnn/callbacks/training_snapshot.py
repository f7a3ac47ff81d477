"""Everything a search's trial steps change, copied to host memory and put back afterwards.

Like Lightning's ``BatchSizeFinder`` (which writes a temporary checkpoint), but in host
memory: nothing is written to disk, no shared filesystem is needed under DDP, no second
copy of the model takes device memory that the budget counts, and the random number
generators are included, so training after the search draws what it would have drawn
without it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_accudnn.callbacks._lightning_internals import (
    Loop,
    collect_rng_states,
    mark_not_resuming,
    set_rng_states,
)

__all__ = ["TrainingSnapshot"]


@dataclass
class TrainingSnapshot:
    """Weights, gradients, optimizer and scheduler state, precision plugin (AMP scaler)
    state, random number generators and loop progress (``global_step``) of a Trainer.

    Attributes the user's LightningModule keeps outside its ``state_dict`` are not covered.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.demos.boring_classes import BoringModel
        >>> trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
        ...                   enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.fit(BoringModel())
        >>> snapshot = TrainingSnapshot.take(trainer)
        >>> weight = trainer.lightning_module.layer.weight
        >>> before = weight.detach().clone()
        >>> with torch.no_grad():
        ...     _ = weight.add_(1.0)
        >>> snapshot.restore(trainer)
        >>> torch.equal(weight, before), trainer.global_step
        (True, 2)
    """

    module_state: dict[str, torch.Tensor]
    gradients: dict[str, torch.Tensor | None]
    optimizer_states: list[dict[str, Any]]
    scheduler_states: list[dict[str, Any]]
    precision_state: dict[str, Any]
    rng_states: dict[str, Any]
    fit_loop_state: dict[str, Any]
    should_stop: bool

    @classmethod
    def take(cls, trainer: pl.Trainer) -> TrainingSnapshot:
        module = trainer.lightning_module
        return cls(
            module_state=_to_host(module.state_dict()),
            gradients={
                name: None if p.grad is None else _to_host(p.grad) for name, p in module.named_parameters()
            },
            optimizer_states=[_to_host(optimizer.state_dict()) for optimizer in trainer.optimizers],
            scheduler_states=[
                copy.deepcopy(config.scheduler.state_dict()) for config in trainer.lr_scheduler_configs
            ],
            precision_state=_to_host(trainer.precision_plugin.state_dict()),
            rng_states=collect_rng_states(include_cuda=torch.cuda.is_available()),
            fit_loop_state=copy.deepcopy(trainer.fit_loop.state_dict()),
            should_stop=trainer.should_stop,
        )

    def restore(self, trainer: pl.Trainer) -> None:
        module = trainer.lightning_module
        module.load_state_dict(self.module_state)
        for name, param in module.named_parameters():
            saved = self.gradients.get(name)
            param.grad = None if saved is None else saved.to(param.device, copy=True)
        for optimizer, state in zip(trainer.optimizers, self.optimizer_states, strict=True):
            optimizer.load_state_dict(copy.deepcopy(state))
        for config, state in zip(trainer.lr_scheduler_configs, self.scheduler_states, strict=True):
            config.scheduler.load_state_dict(copy.deepcopy(state))
        if self.precision_state:
            trainer.precision_plugin.load_state_dict(copy.deepcopy(self.precision_state))
        self.restore_rng()
        trainer.fit_loop.load_state_dict(copy.deepcopy(self.fit_loop_state))
        not_restarting(trainer.fit_loop)
        trainer.should_stop = self.should_stop

    def restore_rng(self) -> None:
        """Only the random number generators (building a dataloader draws from them)."""
        set_rng_states(self.rng_states)


def not_restarting(loop: Loop) -> None:
    """A loop given its old progress back starts afresh, not as if resuming a checkpoint."""
    loop.restarting = False
    for candidate in [loop, *_child_loops(loop)]:
        mark_not_resuming(candidate)


def _child_loops(loop: Loop) -> list[Loop]:
    children = [value for value in vars(loop).values() if isinstance(value, Loop)]
    return children + [grandchild for child in children for grandchild in _child_loops(child)]


def _to_host(obj: Any) -> Any:
    """A deep copy with every tensor copied to the CPU."""
    copied = apply_to_collection(obj, torch.Tensor, lambda t: t.detach().to("cpu", copy=True))
    return copy.deepcopy(copied)
