"""lightning-accudnn: train deep networks whose step does not fit in GPU memory (AccUDNN for Lightning).

Example:
    >>> from lightning.pytorch import Trainer
    >>> from lightning_accudnn import AccUDNNStrategy
    >>> trainer = Trainer(strategy=AccUDNNStrategy(budget="12GB"), accelerator="cpu")
"""

from lightning_accudnn.callbacks import EfficiencyTuner
from lightning_accudnn.ops import SwapSchedule, keep_on_device
from lightning_accudnn.planner import Budget
from lightning_accudnn.strategy import AccUDNNDDPStrategy, AccUDNNStrategy, OffloadStats, register_strategies

register_strategies()

__all__ = [
    "AccUDNNDDPStrategy",
    "AccUDNNStrategy",
    "Budget",
    "EfficiencyTuner",
    "OffloadStats",
    "SwapSchedule",
    "keep_on_device",
]
__version__ = "0.1.0"
