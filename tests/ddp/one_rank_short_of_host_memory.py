"""Run by tests/ddp/launched_ranks.py (for tests/ddp/test_launched.py) last, in its two ranks
(rank 1 the child that Lightning's default launcher, popen, started). The budget forces
swapping; rank 1 alone has a host-memory limit too small to swap anything, so its profiling pass
keeps everything and its plan, made after the first backward, raises HostMemoryExceeded while
rank 0 goes on into the next step's collectives."""

from lightning.pytorch import Trainer

from lightning_accudnn import AccUDNNDDPStrategy
from tests.models import Classifier, loader
from tests.strategy.helpers import memory_need


class OneRankShortOfHostMemory(AccUDNNDDPStrategy):
    def setup(self, trainer):
        if self.global_rank == 1:
            self.offload_config = self.offload_config.replace(host_memory_limit=1)
        super().setup(trainer)


def main() -> None:
    """Fit until rank 1's error ends both ranks (prints "fit returned" only if it does not)."""
    static, saved = memory_need("cnn")
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=OneRankShortOfHostMemory(budget=static + saved // 2, min_swap_bytes=0),
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier("cnn"), loader("cnn", batches=8))
    print("fit returned", flush=True)
