"""AccUDNNDDPStrategy with gloo on 2 CPU processes: equal to plain DDP, full Lightning lifecycle, no hangs."""

import subprocess
import sys
from pathlib import Path

import pytest

from lightning_accudnn import AccUDNNDDPStrategy
from lightning_accudnn.planner import LayerProfile, StepProfile
from lightning_accudnn.session import merge_profiles
from tests.models import Classifier, loader
from tests.strategy.helpers import memory_need, trainer_for

# Spawned process groups must never hang CI: every test here is bounded.
pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


def _trainer(strategy, max_steps=4, **overrides):
    return trainer_for(strategy, max_steps=max_steps, devices=2, **overrides)


def _budget():
    static, saved = memory_need("cnn", batch_size=4)
    return static + saved // 2


SCRIPT = Path(__file__).with_name("plain_and_offloaded_fits.py")
CONFIGURATIONS = ("defaults", "static-graph-bucket-view", "accumulation-no-sync", "find-unused-parameters")


def test_weights_after_several_steps_equal_plain_ddp_bitwise_in_every_configuration():
    """Plain DDP and AccUDNN DDP (swapping forced) trained in the same two ranks, per configuration."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=SCRIPT.parents[2], capture_output=True, text=True, timeout=220
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    reported = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    verdicts = {name: reported.get(name) for name in CONFIGURATIONS}
    assert verdicts == dict.fromkeys(CONFIGURATIONS, "equal"), output[-3000:]


class ValidatedClassifier(Classifier):
    def __init__(self):
        super().__init__("cnn")

    def val_dataloader(self):
        return loader("cnn", batches=2)


def test_registered_name_runs_fit_validate_checkpoint_and_restore(tmp_path):
    model = ValidatedClassifier()
    trainer = _trainer(
        "accudnn_ddp_spawn",
        max_steps=3,
        default_root_dir=tmp_path,
        enable_checkpointing=True,
        limit_val_batches=2,
    )
    assert isinstance(trainer.strategy, AccUDNNDDPStrategy)
    trainer.strategy.offload_config = trainer.strategy.offload_config.replace(min_swap_bytes=0)
    trainer.fit(model, loader("cnn", batches=8))
    checkpoint = next(tmp_path.rglob("*.ckpt"))
    trainer.validate(model, loader("cnn", batches=2))

    resumed = _trainer(
        AccUDNNDDPStrategy(budget="auto", min_swap_bytes=0, start_method="spawn"),
        max_steps=5,
        default_root_dir=tmp_path,
        enable_checkpointing=True,
        limit_val_batches=2,
    )
    resumed.fit(ValidatedClassifier(), loader("cnn", batches=8), ckpt_path=checkpoint)
    # Spawned ranks trained; the step count shows in the checkpoint they wrote.
    assert "step=3" in checkpoint.name
    assert any("step=5" in path.name for path in tmp_path.rglob("*.ckpt"))


class FailingOnRankOne(Classifier):
    def __init__(self):
        super().__init__("cnn")

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if batch_idx == 1 and self.global_rank == 1:
            raise RuntimeError("rank one failed")
        return loss


def test_one_rank_raising_ends_the_run_with_its_error():
    strategy = AccUDNNDDPStrategy(budget=_budget(), min_swap_bytes=0, start_method="spawn")
    with pytest.raises(Exception, match="rank one failed"):
        _trainer(strategy).fit(FailingOnRankOne(), loader("cnn", batches=8))


def test_merged_profile_is_safe_for_every_rank_and_refuses_different_layers():
    a = StepProfile((LayerProfile("x", 10, 8, 1.0, 2.0), LayerProfile("y", 5, 5)), static_bytes=5)
    b = StepProfile(
        (LayerProfile("x", 12, 12, 0.5, 3.0), LayerProfile("y", 4, 4)),
        static_bytes=7,
        d2h_bytes_per_second=1e9,
        h2d_bytes_per_second=2e9,
    )
    merged = merge_profiles([a, b])
    assert [layer.saved_bytes for layer in merged.layers] == [12, 5]
    assert merged.layers[0].resident_bytes == 2  # the most any rank must keep
    assert merged.static_bytes == 7 and merged.d2h_bytes_per_second == 1e9
    with pytest.raises(RuntimeError, match="drop_last"):
        merge_profiles([a, StepProfile((LayerProfile("z", 1, 1),), static_bytes=0)])
