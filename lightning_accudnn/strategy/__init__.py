"""Lightning glue: the AccUDNN strategies and their registration (done when this package is imported)."""

from lightning_accudnn.strategy.ddp import AccUDNNDDPStrategy
from lightning_accudnn.strategy.registry import register_strategies
from lightning_accudnn.strategy.single_device import AccUDNNStrategy

register_strategies()

__all__ = ["AccUDNNDDPStrategy", "AccUDNNStrategy", "register_strategies"]
