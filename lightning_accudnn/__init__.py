"""lightning-accudnn: train deep networks whose step does not fit in GPU memory (AccUDNN for Lightning).

The Lightning names (``AccUDNNStrategy``, ``AccUDNNDDPStrategy``, ``EfficiencyTuner``,
``register_strategies``) are imported on first use, so that ``import lightning_accudnn``
(and the ``accudnn plan`` command) does not import Lightning; the strategy names are
registered with Lightning whichever of the two is imported first.

Example:
    >>> from lightning.pytorch import Trainer
    >>> from lightning_accudnn import AccUDNNStrategy, OffloadConfig
    >>> trainer = Trainer(strategy=AccUDNNStrategy(budget="12GB"), accelerator="cpu")
    >>> trainer = Trainer(strategy=AccUDNNStrategy(config=OffloadConfig(budget="12GB")), accelerator="cpu")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_accudnn.ops import SwapSchedule, keep_on_device
from lightning_accudnn.planner import Budget, BudgetTooSmallError
from lightning_accudnn.registration import register_when_lightning_loads
from lightning_accudnn.session import OffloadConfig, OffloadSession, OffloadStats

if TYPE_CHECKING:
    from lightning_accudnn.callbacks import EfficiencyTuner
    from lightning_accudnn.strategy import AccUDNNDDPStrategy, AccUDNNStrategy, register_strategies

#: Public names that need Lightning, and the module that defines each.
_LIGHTNING_NAMES = {
    "AccUDNNStrategy": "lightning_accudnn.strategy",
    "AccUDNNDDPStrategy": "lightning_accudnn.strategy",
    "register_strategies": "lightning_accudnn.strategy",
    "EfficiencyTuner": "lightning_accudnn.callbacks",
}


def __getattr__(name: str) -> Any:
    module = _LIGHTNING_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_accudnn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LIGHTNING_NAMES))


register_when_lightning_loads()

__all__ = [
    "AccUDNNDDPStrategy",
    "AccUDNNStrategy",
    "Budget",
    "BudgetTooSmallError",
    "EfficiencyTuner",
    "OffloadConfig",
    "OffloadSession",
    "OffloadStats",
    "SwapSchedule",
    "keep_on_device",
    "register_strategies",
]
__version__ = "0.1.0"
