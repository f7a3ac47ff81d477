"""EfficiencyTuner under DDP (gloo, 2 CPU processes): ranks search alone, agree, and never hang."""

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from torch.nn.parallel import DistributedDataParallel

from lightning_accudnn import AccUDNNDDPStrategy, EfficiencyTuner
from lightning_accudnn.session.rank_failure import FAILURE_KEY
from tests._torch_internals import default_process_group_store
from tests.callbacks.helpers import CurveModel, VirtualClock, flat, tuner_trainer

pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


class OutOfMemoryOnRankOne(CurveModel):
    """Rank 1 runs out of memory from batch 32 on, rank 0 never; notes whether DDP wrapped each step."""

    def __init__(self) -> None:
        super().__init__(batch_size=4, lr=0.1, samples=512, clock=VirtualClock(), curve=flat())
        self.wrapped: dict[int, set[bool]] = {}

    def training_step(self, batch, batch_idx):
        size = batch[0].shape[0]
        self.wrapped.setdefault(size, set()).add(
            isinstance(self.trainer.strategy.model, DistributedDataParallel)
        )
        if self.global_rank == 1 and size >= 32:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated on rank 1)")
        return super().training_step(batch, batch_idx)


def _failure_in_store() -> str:
    """What the ranks' failure watch finds in the process group's store ("" when nothing)."""
    store = default_process_group_store()
    return store.get(FAILURE_KEY).decode() if store.check([FAILURE_KEY]) else ""


class RankReport(Callback):
    """Each spawned rank writes what it ended with (the main process does not get callbacks back)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def on_train_end(self, trainer, pl_module) -> None:
        tuner = next(c for c in trainer.callbacks if isinstance(c, EfficiencyTuner))
        report = {
            "batch_size": pl_module.batch_size,
            "lrs": [group["lr"] for group in trainer.optimizers[0].param_groups],
            "trials": [[t.batch_size, t.samples_per_second, t.failure] for t in tuner.search_result.trials],
            "wrapped": {str(size): sorted(flags) for size, flags in pl_module.wrapped.items()},
            "global_step": trainer.global_step,
            "global_batch_size": tuner.decision.global_batch_size,
            "failure_in_store": _failure_in_store(),
        }
        (self.directory / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
        torch.save(pl_module.state_dict(), self.directory / f"rank{trainer.global_rank}.pt")


def test_ranks_agree_on_batch_size_and_learning_rate_and_an_oom_on_one_rank_does_not_hang(tmp_path):
    model = OutOfMemoryOnRankOne()
    # The rate 0.1 was set for a global batch of 4; spawn pickles model and tuner together: one clock.
    tuner = EfficiencyTuner(clock=model.clock, base_batch_size=4)
    strategy = AccUDNNDDPStrategy(budget="1GB", min_swap_bytes=0, start_method="spawn")
    trainer = tuner_trainer(
        tuner, callbacks=[RankReport(tmp_path)], devices=2, strategy=strategy, max_steps=3
    )
    trainer.fit(model)

    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert reports[0] == reports[1]  # same batch size, learning rate, trials, steps
    report = reports[0]
    assert report["batch_size"] == 16
    assert report["trials"][-1][0] == 32 and report["trials"][-1][2].startswith("rank 1: out of memory")
    assert [size for size, _, _ in report["trials"]] == [4, 8, 16, 32]
    # global batch 16 x 2 ranks = 32 over the base 4: SGD's rate grows linearly, 0.1 -> 0.8
    assert report["lrs"] == pytest.approx([0.8])
    assert report["global_batch_size"] == 32
    # the trials ran the module unwrapped (no gradient all-reduce); training ran under DDP
    assert report["wrapped"] == {"4": [False], "8": [False], "16": [False, True], "32": [False]}
    assert report["global_step"] == 3
    # The tuner handled rank 1's out-of-memory trial: it is no rank failure, which would end
    # rank 0 a few seconds later in a run longer than this one.
    assert report["failure_in_store"] == ""
    weights = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name  # gradients were synchronised again


class BugOnRankOne(CurveModel):
    def __init__(self) -> None:
        super().__init__(batch_size=4, samples=512, clock=VirtualClock(), curve=flat())

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch[0].shape[0] == 8:
            raise ValueError("a bug that only rank 1 hits")
        return super().training_step(batch, batch_idx)


def test_an_error_on_one_rank_during_the_search_is_raised_on_every_rank_without_hanging():
    model = BugOnRankOne()
    strategy = AccUDNNDDPStrategy(budget="1GB", min_swap_bytes=0, start_method="spawn")
    trainer = tuner_trainer(EfficiencyTuner(clock=model.clock), devices=2, strategy=strategy)
    with pytest.raises(Exception, match="a bug that only rank 1 hits"):
        trainer.fit(model)
