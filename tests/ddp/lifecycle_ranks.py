"""Fit, validate and resume in two gloo ranks: the registered name ``"accudnn_ddp"`` fits (with
validation and a checkpoint), validates, and a new Trainer resumes from the checkpoint.

Run by tests/ddp/launched_ranks.py (for tests/ddp/test_launched.py) in its two ranks: the
calls after the first find the process group already there and reuse it."""

from pathlib import Path

import torch

from lightning_accudnn import AccUDNNDDPStrategy
from tests.models import Classifier, loader
from tests.strategy.helpers import trainer_for


class ValidatedClassifier(Classifier):
    def __init__(self):
        super().__init__("cnn")

    def val_dataloader(self):
        return loader("cnn", batches=2)


def _trainer(strategy, root: Path, max_steps: int):
    return trainer_for(
        strategy,
        max_steps=max_steps,
        devices=2,
        default_root_dir=root,
        enable_checkpointing=True,
        limit_val_batches=2,
    )


def main(root: Path) -> None:
    """Fit, validate and resume under ``root``; rank 0 prints the checkpoint it resumed from."""
    model = ValidatedClassifier()
    trainer = _trainer("accudnn_ddp", root, max_steps=3)
    assert isinstance(trainer.strategy, AccUDNNDDPStrategy), type(trainer.strategy)
    trainer.strategy.offload_config = trainer.strategy.offload_config.replace(min_swap_bytes=0)
    trainer.fit(model, loader("cnn", batches=8))
    checkpoint = next(root.rglob("*.ckpt"))
    trainer.validate(model, loader("cnn", batches=2))

    resumed = _trainer(AccUDNNDDPStrategy(budget="auto", min_swap_bytes=0), root, max_steps=5)
    resumed.fit(ValidatedClassifier(), loader("cnn", batches=8), ckpt_path=checkpoint)
    if torch.distributed.get_rank() == 0:
        print(f"resumed from {checkpoint.name}", flush=True)
