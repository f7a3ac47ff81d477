"""``AccUDNNStrategy``: Lightning's single-device strategy with activation swapping under a budget."""

from __future__ import annotations

from collections.abc import Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES
from lightning_accudnn.strategy.controller import OffloadController
from lightning_accudnn.strategy.offload_hooks import OffloadHooks


class AccUDNNStrategy(OffloadHooks, SingleDeviceStrategy):
    """Train on one device whose memory is smaller than the step needs.

    Saved activations of the layers the performance model picks are swapped to pinned host
    memory during forward and prefetched back during backward, so the step fits ``budget``:
    an int of bytes, ``"12GB"``, ``"12000MB"``, ``"12GiB"``, ``"80%"`` of the device or
    ``"auto"``. On CUDA the budget caps the caching allocator, so a large card behaves like
    a small one. The first step profiles in the safe mode (swap everything swappable).

    Args:
        budget: device memory the step may use.
        device: the device; by default the one the Trainer's ``accelerator``/``devices`` name.
        min_swap_bytes: saved tensors smaller than this stay on the device.
        keep_on_device: module name patterns (``fnmatch``) whose activations never swap,
            e.g. ``["head", "decoder.layers.23.*"]``.
        host_memory_limit: cap on pinned host memory (same forms as ``budget``, against
            system RAM); by default half of system RAM.
        reserve_bytes: kept free under the budget for fragmentation and workspaces (CUDA
            default: the larger of 256 MiB and 5% of the budget; CPU default: 0).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(accelerator="cpu", strategy=AccUDNNStrategy(budget="2GB"), max_steps=1)
        >>> # trainer.fit(model) then trainer.strategy.stats.bytes_swapped_out
    """

    strategy_name = "accudnn"

    def __init__(
        self,
        budget: int | str = "auto",
        *,
        device: torch.device | str | int | None = None,
        min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES,
        keep_on_device: Sequence[str] = (),
        host_memory_limit: int | str | None = None,
        reserve_bytes: int | None = None,
        accelerator: pl.accelerators.Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(
            device="cpu" if device is None else device,
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._device_given = device is not None
        # Filled by Lightning's accelerator connector from Trainer(accelerator=..., devices=...).
        self.parallel_devices: list[torch.device] | None = None
        self._controller = OffloadController(
            budget,
            min_swap_bytes=min_swap_bytes,
            keep_on_device=keep_on_device,
            host_memory_limit=host_memory_limit,
            reserve_bytes=reserve_bytes,
        )

    @property
    def root_device(self) -> torch.device:
        if self._device_given or not self.parallel_devices:
            return self._root_device
        if len(self.parallel_devices) > 1:
            raise ValueError(
                f"AccUDNNStrategy trains on one device, the Trainer asks for {len(self.parallel_devices)}: "
                'use Trainer(devices=1), or strategy="accudnn_ddp" for several devices'
            )
        return self.parallel_devices[0]
