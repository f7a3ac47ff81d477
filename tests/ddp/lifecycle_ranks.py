"""Fit, validate and resume in two gloo ranks: the registered name ``"accudnn_ddp"`` fits (with
validation and a checkpoint), validates, and a new Trainer resumes from the checkpoint.

Run by tests/ddp/launched_ranks.py (for tests/ddp/test_launched.py), or alone as a script.
Lightning's default launcher (popen) starts rank 1 as a child running the script again; the
later calls of both ranks find the process group already there and reuse it, so the three
Trainer calls cost one launch instead of three spawns.

Usage: ``python tests/ddp/lifecycle_ranks.py ROOT`` (checkpoints are written under ROOT)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from lightning_accudnn import AccUDNNDDPStrategy  # noqa: E402
from tests.models import Classifier, loader  # noqa: E402
from tests.strategy.helpers import trainer_for  # noqa: E402


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


if __name__ == "__main__":
    torch.set_num_threads(1)  # two ranks share the cores, as torchrun's OMP_NUM_THREADS=1 has them
    main(Path(sys.argv[1]))
