"""AccUDNNDDPStrategy with gloo on 2 spawned CPU processes: an error on one rank ends the run with it."""

import pytest

from lightning_accudnn import AccUDNNDDPStrategy
from tests.models import Classifier, loader
from tests.strategy.helpers import memory_need, trainer_for

# Spawned process groups must never hang CI: every test here is bounded.
pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


def _budget():
    static, saved = memory_need("cnn", batch_size=4)
    return static + 3 * saved // 5  # the least plan keeps the batch: a little over half


class FailingOnRankOne(Classifier):
    def __init__(self):
        super().__init__("cnn")

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 1 and self.global_rank == 1:
            raise RuntimeError("rank one failed")
        return loss


def test_one_rank_raising_ends_the_run_with_its_error():
    """Through the registered name ``"accudnn_ddp_spawn"`` (``"accudnn_ddp"`` fits in test_launched.py).
    Spawned, not forked: a fork of a process that has run autograd cannot run a backward."""
    trainer = trainer_for("accudnn_ddp_spawn", max_steps=4, devices=2)
    assert isinstance(trainer.strategy, AccUDNNDDPStrategy)
    trainer.strategy.offload_config = trainer.strategy.offload_config.replace(
        budget=_budget(), min_swap_bytes=0
    )
    with pytest.raises(Exception, match="rank one failed"):
        trainer.fit(FailingOnRankOne(), loader("cnn", batches=8))
