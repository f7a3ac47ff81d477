"""Lightning glue: the AccUDNN strategies and their registration."""

from lightning_accudnn.strategy.controller import OffloadController, OffloadStats
from lightning_accudnn.strategy.registry import register_strategies
from lightning_accudnn.strategy.single_device import AccUDNNStrategy

__all__ = ["AccUDNNStrategy", "OffloadController", "OffloadStats", "register_strategies"]
