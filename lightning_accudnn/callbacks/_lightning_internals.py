"""Every use of a private Lightning attribute in the tuner, in one place.

Lightning has no public way to rebuild the train dataloader after a batch-size change, to
run trial steps without the per-step SIGTERM broadcast, or to reset logged results; its
own batch-size finder (``lightning.pytorch.tuner.batch_size_scaling``) uses these same
attributes.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.loops.loop import _Loop

#: Lightning's base class of its loops (private in Lightning).
Loop = _Loop

__all__ = [
    "Loop",
    "collect_rng_states",
    "set_rng_states",
    "data_comes_from_module",
    "mark_not_resuming",
    "rebuild_train_dataloader",
    "reset_logged_results",
    "restore_sigterm_broadcast",
    "skip_sigterm_broadcast",
    "train_dataset_length",
]


def data_comes_from_module(trainer: pl.Trainer) -> bool:
    """True when the train dataloader comes from the LightningModule or a DataModule."""
    return bool(trainer.fit_loop._data_source.is_module())


def train_dataset_length(trainer: pl.Trainer) -> int | None:
    """Samples in the train dataset (all devices together); ``None`` for iterable-style data."""
    trainer.fit_loop.setup_data()
    combined = trainer.fit_loop._combined_loader
    if combined is None:
        return None
    try:
        return int(combined._dataset_length())
    except NotImplementedError:
        return None


def rebuild_train_dataloader(trainer: pl.Trainer) -> None:
    """Build the train dataloader again; validation's is rebuilt when next needed."""
    loop = trainer.fit_loop
    loop._combined_loader = None
    loop.setup_data()
    loop.epoch_loop.val_loop._combined_loader = None


def _no_sigterm_broadcast() -> None:
    return None


def skip_sigterm_broadcast(trainer: pl.Trainer) -> None:
    """The epoch loop stops broadcasting its SIGTERM flag every step (a failed rank would answer it)."""
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = _no_sigterm_broadcast  # type: ignore[method-assign]


def restore_sigterm_broadcast(trainer: pl.Trainer) -> None:
    del trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor  # back to the loop's own method


def reset_logged_results(trainer: pl.Trainer) -> None:
    """Forget what trial steps logged."""
    trainer._logger_connector.reset_results()
    trainer._logger_connector.reset_metrics()


def mark_not_resuming(loop: Any) -> None:
    """A loop given its old progress back starts afresh, not as if resuming a checkpoint."""
    loop._loaded_from_state_dict = False
    loop._resuming_from_checkpoint = False


def collect_rng_states(include_cuda: bool = True) -> dict[str, Any]:
    """The states of every random number generator Lightning seeds (torch, CUDA, numpy, python)."""
    states: dict[str, Any] = _collect_rng_states(include_cuda=include_cuda)
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    _set_rng_states(states)
