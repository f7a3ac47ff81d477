"""After ``import lightning_accudnn`` the Trainer knows the strategy by name."""

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

import lightning_accudnn
from lightning_accudnn import AccUDNNStrategy


def test_strategy_name_resolves_to_accudnn_with_auto_budget():
    trainer = Trainer(strategy="accudnn", accelerator="cpu", devices=1, logger=False)
    assert isinstance(trainer.strategy, AccUDNNStrategy)
    assert str(trainer.strategy.offload_config.budget) == "auto"


def test_registration_is_idempotent():
    lightning_accudnn.register_strategies()
    assert "accudnn" in StrategyRegistry


def test_device_follows_the_trainer_and_several_devices_are_refused():
    trainer = Trainer(strategy=AccUDNNStrategy(budget="1GB"), accelerator="cpu", devices=1, logger=False)
    assert trainer.strategy.root_device.type == "cpu"
    strategy = AccUDNNStrategy(budget="1GB")
    strategy.parallel_devices = ["cpu:0", "cpu:1"]
    with pytest.raises(ValueError, match="accudnn_ddp"):
        _ = strategy.root_device
