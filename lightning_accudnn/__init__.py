"""lightning-accudnn: train deep networks whose step does not fit in GPU memory (AccUDNN for Lightning).

Every public name is imported on first use, so that ``import lightning_accudnn`` (and the
``accudnn plan`` command) imports neither Lightning nor what it does not use; the strategy
names are registered with Lightning whichever of the two is imported first.

Example:
    >>> from lightning.pytorch import Trainer
    >>> from lightning_accudnn import AccUDNNStrategy, OffloadConfig
    >>> trainer = Trainer(strategy=AccUDNNStrategy(budget="12GB"), accelerator="cpu")
    >>> trainer = Trainer(strategy=AccUDNNStrategy(config=OffloadConfig(budget="12GB")), accelerator="cpu")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_accudnn.lazy_names import lazy_names
from lightning_accudnn.registration import register_when_lightning_loads

if TYPE_CHECKING:
    from lightning_accudnn.callbacks import EfficiencyTuner
    from lightning_accudnn.ops import SwapSchedule, keep_on_device
    from lightning_accudnn.planner import (
        Budget,
        BudgetTooSmallError,
        HostLimitTooSmallError,
        NothingToRecomputeError,
    )
    from lightning_accudnn.session import OffloadConfig, OffloadSession, OffloadStats
    from lightning_accudnn.session.out_of_memory import (
        OutOfMemoryAfterRetriesError,
        ProfilingPassOutOfMemoryError,
    )
    from lightning_accudnn.strategy import AccUDNNDDPStrategy, AccUDNNStrategy, register_strategies

#: Every public name, and the module that defines it: each is imported on first use.
_PUBLIC_NAMES = {
    "AccUDNNStrategy": "lightning_accudnn.strategy",
    "AccUDNNDDPStrategy": "lightning_accudnn.strategy",
    "register_strategies": "lightning_accudnn.strategy",
    "EfficiencyTuner": "lightning_accudnn.callbacks",
    "SwapSchedule": "lightning_accudnn.ops",
    "keep_on_device": "lightning_accudnn.ops",
    "Budget": "lightning_accudnn.planner",
    "BudgetTooSmallError": "lightning_accudnn.planner",
    "HostLimitTooSmallError": "lightning_accudnn.planner",
    "NothingToRecomputeError": "lightning_accudnn.planner",
    "OffloadConfig": "lightning_accudnn.session",
    "OffloadSession": "lightning_accudnn.session",
    "OffloadStats": "lightning_accudnn.session",
    "OutOfMemoryAfterRetriesError": "lightning_accudnn.session.out_of_memory",
    "ProfilingPassOutOfMemoryError": "lightning_accudnn.session.out_of_memory",
}


__getattr__, __dir__ = lazy_names(globals(), _PUBLIC_NAMES)


register_when_lightning_loads()

__all__ = [
    "AccUDNNDDPStrategy",
    "AccUDNNStrategy",
    "Budget",
    "BudgetTooSmallError",
    "EfficiencyTuner",
    "HostLimitTooSmallError",
    "NothingToRecomputeError",
    "OffloadConfig",
    "OffloadSession",
    "OffloadStats",
    "OutOfMemoryAfterRetriesError",
    "ProfilingPassOutOfMemoryError",
    "SwapSchedule",
    "keep_on_device",
    "register_strategies",
]
__version__ = "0.1.0"
