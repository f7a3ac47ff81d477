"""The strategy hooks every AccUDNN strategy shares, as a mixin over a Lightning strategy."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.strategy.controller import OffloadController, OffloadStats


def _refuse_compiled(module: pl.LightningModule) -> None:
    """Saved-tensor hooks and ``torch.compile`` do not mix (pytorch #116221, #148222): refuse."""
    compiled = getattr(module, "_compiler_ctx", None) is not None or any(
        isinstance(child, torch._dynamo.eval_frame.OptimizedModule) for child in module.modules()
    )
    if compiled:
        raise ValueError(
            "AccUDNN strategies refuse a torch.compile'd model: the saved-tensor hooks they rely on are "
            "not reliably honoured inside compiled graphs (pytorch issues #116221, #148222), so "
            "activations could silently stay on the device. Pass the uncompiled module, or use "
            "torch.compile with torch._functorch.config.activation_memory_budget instead of this strategy."
        )


class OffloadHooks:
    """Wraps a Lightning strategy's training step and backward with an :class:`OffloadController`.

    Put it first among the bases (``class S(OffloadHooks, SingleDeviceStrategy)``) and set
    ``self._controller`` in ``__init__``; every hook calls on to the Lightning strategy,
    so precision plugins, DDP's forward redirection and gradient hooks still apply.

    Example:
        >>> from lightning_accudnn import AccUDNNStrategy
        >>> issubclass(AccUDNNStrategy, OffloadHooks)
        True
    """

    _controller: OffloadController

    @property
    def stats(self) -> OffloadStats | None:
        """Figures of the last training step (``None`` before the first)."""
        return self._controller.stats

    @property
    def plan(self) -> Plan | None:
        """The swap plan in force (``None`` until the profiling step has run)."""
        return self._controller.plan

    def setup(self, trainer: pl.Trainer) -> None:
        _refuse_compiled(trainer.lightning_module)
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
        module = self.lightning_module
        trainer = module.trainer if module is not None else None
        if trainer is None or not trainer.loggers:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            for logger in trainer.loggers:
                logger.log_metrics(stats.as_metrics(), step=trainer.global_step)
