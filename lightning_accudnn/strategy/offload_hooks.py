"""The strategy hooks every AccUDNN strategy shares, as a mixin over a Lightning strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch import Tensor
from torch.optim import Optimizer

from lightning_accudnn.ops import Runtime
from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.planner.budget import Budget
from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.session import OffloadConfig, OffloadSession, OffloadStats
from lightning_accudnn.session.allocator import AllocatorControl
from lightning_accudnn.session.buffer_snapshot import BufferSnapshot
from lightning_accudnn.session.compiled import CompiledModelError, refusal_message
from lightning_accudnn.session.coordination import RankCoordinator
from lightning_accudnn.session.out_of_memory import is_out_of_memory
from lightning_accudnn.session.rank_failure import RankFailureWatch
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
    #: How the session caps the device allocator and reads its peaks; ``None``: CUDA's caching
    #: allocator on a GPU, nothing on CPU. Tests set a fake before ``fit``.
    offload_allocator: AllocatorControl | None = None
    #: The offload session (budget, reserve, plan, stats); ``None`` until the Trainer sets up.
    offload: OffloadSession | None = None
    #: Whether a training step that runs out of device memory under a plan is re-planned with
    #: a larger reserve and retried (:meth:`OffloadSession.recover_from_out_of_memory`), and one
    #: whose recomputation of a segment failed in backward is re-planned without that segment
    #: and retried (:meth:`OffloadSession.abort`).
    retries_out_of_memory: bool = True
    _buffers: BufferSnapshot | None = None
    #: Tells the other ranks about this rank's error and ends this rank on theirs (DDP only).
    failure_watch: RankFailureWatch | None = None
    _rerunning = False

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
        form = "torch.compile(model) of the LightningModule" if compiled_by_lightning(module) else None
        if form is not None and self.offload_config.whole_model_compile is None:
            raise CompiledModelError(refusal_message(form))
        if trainer.state.fn != TrainerFn.FITTING:  # evaluation runs without hooks: keep the last figures
            super().setup(trainer)  # type: ignore[misc]
            return
        if self.offload is not None:
            self.offload.close()
        self.offload = OffloadSession(
            self.offload_config,
            self.root_device,  # type: ignore[attr-defined]
            runtime=self.offload_runtime,
            allocator=self.offload_allocator,
            coordinator=self.make_coordinator(),
            report=rank_zero_info,
            on_stats=self._log_stats,
        )
        self.offload.check_model(module, compiled_form=form)
        super().setup(trainer)  # type: ignore[misc]
        # Taken before each step, put back before a retry (buffers on their device by now).
        self._buffers = self.offload.snapshot_buffers(module) if self.retries_out_of_memory else None
        self._rerunning = False

    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        batch = args[0] if args else kwargs.get("batch", ())
        session = self._session()
        module = self.lightning_module  # type: ignore[attr-defined]
        if self._buffers is not None and not self._rerunning:
            self._buffers.take()
        while True:
            try:
                with session.step(module, self.optimizers, batch=batch, close_on_backward=False):  # type: ignore[attr-defined]
                    return super().training_step(*args, **kwargs)  # type: ignore[misc]
            except BaseException as error:
                if not (self.retries_out_of_memory and is_out_of_memory(error)):
                    self._report_failure(error)
                    raise
                try:
                    recovered = session.recover_from_out_of_memory(error)
                except BaseException as refusal:  # the budget is too small: no retry can help
                    self._report_failure(refusal)
                    raise
                if not recovered:
                    self._report_failure(error)
                    raise
                self._restore_buffers()
            session.release_failed_pass()  # the error is gone now: what only it held can go too

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        """Lightning's optimizer step; a closure that runs out of device memory in backward, or
        whose recomputation of a segment fails there, is re-planned and run again (training step,
        zero_grad, backward) when that is exact."""
        retried = self._retrying(closure) if self._closure_can_rerun() else closure
        return super().optimizer_step(optimizer, retried, model, **kwargs)  # type: ignore[misc]

    def _closure_can_rerun(self) -> bool:
        """Running the closure again gives the same gradients only when it zeroes them itself:
        automatic optimization without gradient accumulation (Lightning's closure then runs
        training_step, zero_grad, backward)."""
        module = self.lightning_module  # type: ignore[attr-defined]
        trainer = None if module is None else module.trainer
        return (
            self.retries_out_of_memory
            and trainer is not None
            and module.automatic_optimization
            and trainer.accumulate_grad_batches == 1
        )

    def _retrying(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        session = self._session()

        def run() -> Any:
            while True:
                try:
                    return closure()
                except BaseException as error:
                    recovered = isinstance(error, RecomputationError) or (
                        is_out_of_memory(error) and session.recover_from_out_of_memory(error)
                    )
                    if not recovered:
                        raise
                finally:
                    self._rerunning = False
                self._restore_buffers()
                session.release_failed_pass()
                self._rerunning = True  # the training step must not take the snapshot again

        return run

    def _restore_buffers(self) -> None:
        if self._buffers is not None:
            self._buffers.restore()

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        session = self._session()
        try:
            session.begin_backward()
            output: Tensor = super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]
        except BaseException as error:
            failed = session.abort(error)  # a failed recomputation: its segment is excluded, re-planned
            if failed is None:
                if not (self.retries_out_of_memory and is_out_of_memory(error)):
                    self._report_failure(error)
                raise
            if not self._closure_can_rerun():  # else the optimizer step's closure runs the step again
                self._report_failure(failed)
            if failed is error:
                raise
            raise failed from error
        try:
            session.end_backward()
        except BaseException as error:
            self._report_failure(error)
            raise
        return output

    def on_validation_start(self) -> None:
        self._pause_training()
        super().on_validation_start()  # type: ignore[misc]

    def on_test_start(self) -> None:
        self._pause_training()
        super().on_test_start()  # type: ignore[misc]

    def on_predict_start(self) -> None:
        self._pause_training()
        super().on_predict_start()  # type: ignore[misc]

    def on_train_end(self) -> None:
        self._pause_training()
        super().on_train_end()  # type: ignore[misc]

    def _pause_training(self) -> None:
        """Evaluation is not held to the training budget: the allocator cap is lifted."""
        if self.offload is not None:
            self.offload.pause_training()

    def _report_failure(self, error: BaseException) -> None:
        """Leave ``error`` for the other ranks, which end on it; not while this rank runs steps
        alone (the tuner's trials: the tuner settles their errors with the other ranks)."""
        if self.failure_watch is not None and not (self.offload is not None and self.offload.plans_alone):
            self.failure_watch.report(error)

    def on_exception(self, exception: BaseException) -> None:
        self._report_failure(exception)
        if self.offload is not None:
            self.offload.abort()
        super().on_exception(exception)  # type: ignore[misc]

    def teardown(self) -> None:
        if self.failure_watch is not None:
            self.failure_watch.stop()
            self.failure_watch = None
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
