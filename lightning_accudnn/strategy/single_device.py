"""``AccUDNNStrategy``: Lightning's single-device strategy with activation swapping under a budget."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_accudnn.ops import Runtime
from lightning_accudnn.planner.budget import Budget
from lightning_accudnn.session import OffloadConfig
from lightning_accudnn.session.device import require_available
from lightning_accudnn.strategy._lightning_internals import declared_device
from lightning_accudnn.strategy.offload_hooks import OffloadHooks, offload_config


class AccUDNNStrategy(OffloadHooks, SingleDeviceStrategy):
    """Train on one device whose memory is smaller than the step needs.

    Saved activations of the layers the performance model picks are swapped to pinned host
    memory during forward and prefetched back during backward, so the step fits ``budget``:
    an int of bytes, ``"12GB"``, ``"12000MB"``, ``"12GiB"``, ``"80%"`` of the device or
    ``"auto"``. On CUDA the budget caps the caching allocator, so a large card behaves like
    a small one. The first step profiles in the safe mode (swap everything swappable).

    Offload options come as one :class:`~lightning_accudnn.OffloadConfig` (``config=``), as
    keywords naming its fields (``budget``, ``min_swap_bytes``, ``keep_on_device``,
    ``host_memory_limit``, ``reserve_bytes``, ``policy``, ``whole_model_compile``,
    ``whole_model_backend``), or both (the keywords win). A model compiled whole
    (``LightningModule.compile()``, ``torch.compile(model)``) is refused before training unless
    ``whole_model_compile="experimental"`` plans it inside its compiled graph (PyTorch 2.14.1).
    ``device`` is by default the one the Trainer's ``accelerator``/``devices`` name; the session
    (``strategy.offload``: budget, reserve, plan, stats) is made when the Trainer sets up.
    ``runtime`` is the device runtime the engine runs on (default: CUDA streams on a GPU, host
    copies on CPU; ``lightning_accudnn.testing.SimulatedGPU`` plays a GPU on CPU).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning_accudnn import OffloadConfig
        >>> trainer = Trainer(accelerator="cpu", strategy=AccUDNNStrategy(budget="2GB"), max_steps=1)
        >>> # trainer.fit(model) then trainer.strategy.stats.bytes_swapped_out
        >>> strategy = AccUDNNStrategy(config=OffloadConfig(budget="2GB", keep_on_device=["head"]))
        >>> AccUDNNStrategy("2GB", min_swap_bytes=0).offload_config.min_swap_bytes
        0
    """

    strategy_name = "accudnn"

    def __init__(
        self,
        budget: Budget | int | str | None = None,
        *,
        config: OffloadConfig | None = None,
        device: torch.device | str | int | None = None,
        accelerator: pl.accelerators.Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        runtime: Runtime | None = None,
        **options: Any,
    ) -> None:
        self.offload_config = offload_config(config, budget, options)
        self.offload_runtime = runtime
        if device is not None:
            require_available(torch.device(device))
        super().__init__(
            device="cpu" if device is None else device,
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._device_given = device is not None
        # Filled by Lightning's accelerator connector from Trainer(accelerator=..., devices=...).
        self.parallel_devices: list[torch.device] | None = None

    @property
    def root_device(self) -> torch.device:
        if self._device_given or not self.parallel_devices:
            return declared_device(self)
        if len(self.parallel_devices) > 1:
            raise ValueError(
                f"AccUDNNStrategy trains on one device, the Trainer asks for {len(self.parallel_devices)}: "
                'use Trainer(devices=1), or strategy="accudnn_ddp" for several devices'
            )
        return self.parallel_devices[0]
