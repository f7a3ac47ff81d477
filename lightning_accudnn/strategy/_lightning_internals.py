"""Every read of a private Lightning attribute in the strategies, in one place."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

__all__ = ["compiled_by_lightning", "declared_device"]


def compiled_by_lightning(module: pl.LightningModule) -> bool:
    """True when Lightning compiled the module itself (``LightningModule._compiler_ctx`` is set)."""
    return getattr(module, "_compiler_ctx", None) is not None


def declared_device(strategy: SingleDeviceStrategy) -> torch.device:
    """The device a ``SingleDeviceStrategy`` was built with (``SingleDeviceStrategy._root_device``)."""
    device: torch.device = strategy._root_device
    return device
