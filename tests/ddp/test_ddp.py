"""AccUDNNDDPStrategy with gloo on 2 CPU processes: equal to plain DDP, full Lightning lifecycle, no hangs."""

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy

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


class PartlyUnused(Classifier):
    """A second head that gets no gradient: DDP needs find_unused_parameters for it."""

    def __init__(self):
        super().__init__("cnn")
        self.unused_head = torch.nn.Linear(16, 10)


@pytest.mark.parametrize(
    ("model_class", "ddp_options", "trainer_options"),
    [
        (Classifier, {}, {}),
        (Classifier, {"static_graph": True, "gradient_as_bucket_view": True}, {}),
        (Classifier, {}, {"accumulate_grad_batches": 2}),
        (PartlyUnused, {"find_unused_parameters": True}, {}),
    ],
    ids=["defaults", "static-graph-bucket-view", "accumulation-no-sync", "find-unused-parameters"],
)
def test_weights_after_several_steps_equal_plain_ddp_bitwise(model_class, ddp_options, trainer_options):
    torch.manual_seed(0)
    plain, swapped = model_class(), model_class()
    swapped.load_state_dict(plain.state_dict())
    plain_strategy = DDPStrategy(start_method="spawn", **ddp_options)
    _trainer(plain_strategy, **trainer_options).fit(plain, loader("cnn", batches=8))
    strategy = AccUDNNDDPStrategy(budget=_budget(), min_swap_bytes=0, start_method="spawn", **ddp_options)
    _trainer(strategy, **trainer_options).fit(swapped, loader("cnn", batches=8))
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs"


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
