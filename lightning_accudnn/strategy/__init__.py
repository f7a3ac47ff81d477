"""Lightning glue: the AccUDNN strategies and their registration."""

from lightning_accudnn.planner.coordination import RankCoordinator
from lightning_accudnn.strategy.controller import OffloadController, OffloadStats
from lightning_accudnn.strategy.ddp import AccUDNNDDPStrategy, merge_profiles
from lightning_accudnn.strategy.registry import register_strategies
from lightning_accudnn.strategy.single_device import AccUDNNStrategy

__all__ = [
    "AccUDNNDDPStrategy",
    "AccUDNNStrategy",
    "OffloadController",
    "OffloadStats",
    "RankCoordinator",
    "merge_profiles",
    "register_strategies",
]
