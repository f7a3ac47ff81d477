"""``AccUDNNStrategy``: Lightning's single-device strategy with activation swapping under a budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer

from lightning_accudnn.ops import DEFAULT_MIN_SWAP_BYTES
from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.strategy.controller import OffloadController, OffloadStats


class AccUDNNStrategy(SingleDeviceStrategy):
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

    @property
    def stats(self) -> OffloadStats | None:
        """Figures of the last training step (``None`` before the first)."""
        return self._controller.stats

    @property
    def plan(self) -> Plan | None:
        """The swap plan in force (``None`` until the profiling step has run)."""
        return self._controller.plan

    def setup(self, trainer: pl.Trainer) -> None:
        self._controller.setup(self.root_device)
        super().setup(trainer)

    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        batch = args[0] if args else kwargs.get("batch")
        with self._controller.forward(self.lightning_module, self.optimizers, batch):
            return super().training_step(*args, **kwargs)

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        self._controller.begin_backward()
        try:
            output = super().backward(closure_loss, optimizer, *args, **kwargs)
        except BaseException:
            self._controller.abort()
            raise
        stats = self._controller.end_step()
        if stats is not None:
            self._log_stats(stats)
        return output

    def on_exception(self, exception: BaseException) -> None:
        self._controller.abort()
        super().on_exception(exception)

    def teardown(self) -> None:
        self._controller.teardown()
        super().teardown()

    def _log_stats(self, stats: OffloadStats) -> None:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or not trainer.loggers:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            for logger in trainer.loggers:
                logger.log_metrics(stats.as_metrics(), step=trainer.global_step)
