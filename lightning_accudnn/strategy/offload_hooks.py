"""The strategy hooks every AccUDNN strategy shares, as a mixin over a Lightning strategy."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer

from lightning_accudnn.ops import Runtime
from lightning_accudnn.planner.budget import Budget
from lightning_accudnn.planner.coordination import RankCoordinator
from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.session import OffloadConfig, OffloadSession, OffloadStats
from lightning_accudnn.strategy._lightning_internals import compiled_by_lightning


class OffloadHooks:
    """Wraps a Lightning strategy's training step and backward with an :class:`OffloadSession`.

    Put it first among the bases (``class S(OffloadHooks, SingleDeviceStrategy)``) and set
    ``self.offload_config`` in ``__init__``; the session (``self.offload``) is made in
    :meth:`setup`, on the device the Trainer chose. Every hook calls on to the Lightning
    strategy, so precision plugins, DDP's forward redirection and gradient hooks still apply.

    Example:
        >>> from lightning_accudnn import AccUDNNStrategy
        >>> strategy = AccUDNNStrategy(budget="2GB")
        >>> isinstance(strategy, OffloadHooks), strategy.offload  # no session before setup
        (True, None)
    """

    offload_config: OffloadConfig
    #: The device runtime the session's engine runs on; ``None``: CUDA streams on a GPU, host
    #: copies on CPU. ``lightning_accudnn.testing.SimulatedGPU`` plays a GPU on CPU.
    offload_runtime: Runtime | None = None
    #: The offload session (budget, reserve, plan, stats); ``None`` until the Trainer sets up.
    offload: OffloadSession | None = None

    @property
    def stats(self) -> OffloadStats | None:
        """Figures of the last training pass (``None`` before the first)."""
        return None if self.offload is None else self.offload.stats

    @property
    def plan(self) -> Plan | None:
        """The swap plan in force (``None`` until the profiling pass has run)."""
        return None if self.offload is None else self.offload.plan

    def make_coordinator(self) -> RankCoordinator:
        """How this strategy's ranks agree on plans (one process: with itself)."""
        return RankCoordinator()

    def setup(self, trainer: pl.Trainer) -> None:
        module = trainer.lightning_module
        if compiled_by_lightning(module):
            raise ValueError(
                "AccUDNN strategies refuse a torch.compile'd model: the saved-tensor hooks they rely on are "
                "not reliably honoured inside compiled graphs (pytorch issues #116221, #148222), so "
                "activations could silently stay on the device. Pass the uncompiled module."
            )
        if trainer.state.fn != TrainerFn.FITTING:  # evaluation runs without hooks: keep the last figures
            super().setup(trainer)  # type: ignore[misc]
            return
        if self.offload is not None:
            self.offload.close()
        self.offload = OffloadSession(
            self.offload_config,
            self.root_device,  # type: ignore[attr-defined]
            runtime=self.offload_runtime,
            coordinator=self.make_coordinator(),
            report=rank_zero_info,
            on_stats=self._log_stats,
        )
        self.offload.check_model(module)
        super().setup(trainer)  # type: ignore[misc]

    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        batch = args[0] if args else kwargs.get("batch", ())
        session = self._session()
        module = self.lightning_module  # type: ignore[attr-defined]
        with session.step(module, self.optimizers, batch=batch, close_on_backward=False):  # type: ignore[attr-defined]
            return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        session = self._session()
        session.begin_backward()
        try:
            output: Tensor = super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]
        except BaseException:
            session.abort()
            raise
        session.end_backward()
        return output

    def on_exception(self, exception: BaseException) -> None:
        if self.offload is not None:
            self.offload.abort()
        super().on_exception(exception)  # type: ignore[misc]

    def teardown(self) -> None:
        if self.offload is not None:
            self.offload.close()
        super().teardown()  # type: ignore[misc]

    def _session(self) -> OffloadSession:
        if self.offload is None:
            raise RuntimeError(
                f"{type(self).__name__} is not set up: the Trainer calls setup() before training"
            )
        return self.offload

    def _log_stats(self, stats: OffloadStats) -> None:
        module = self.lightning_module  # type: ignore[attr-defined]
        trainer = module.trainer if module is not None else None
        if trainer is None or not trainer.loggers:
            return
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            for logger in trainer.loggers:
                logger.log_metrics(stats.as_metrics(), step=trainer.global_step)


def offload_config(
    config: OffloadConfig | None, budget: Budget | int | str | None, options: dict[str, Any]
) -> OffloadConfig:
    """The strategies' one way to read their offload arguments: ``config`` with the keywords on top.

    Example:
        >>> offload_config(None, "2GB", {"min_swap_bytes": 0}).min_swap_bytes
        0
    """
    if budget is not None:
        options = {"budget": budget, **options}
    return OffloadConfig.of(config, **options)
