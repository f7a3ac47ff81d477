"""AccUDNNDDPStrategy with gloo on 2 CPU processes: the full Lightning lifecycle, and merged profiles.

Equal weights to plain DDP: test_ddp_bitwise.py; an error on one rank: test_ddp_rank_error.py
(split apart so that pytest-xdist can run them on different workers)."""

import pytest

from lightning_accudnn import AccUDNNDDPStrategy
from lightning_accudnn.planner import LayerProfile, StepProfile
from lightning_accudnn.session import merge_profiles
from tests.models import Classifier, loader
from tests.strategy.helpers import trainer_for

# Spawned process groups must never hang CI: every test here is bounded.
pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


def _trainer(strategy, max_steps=4, **overrides):
    return trainer_for(strategy, max_steps=max_steps, devices=2, **overrides)


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
