"""What the tuner needs to know about the Trainer's strategy, read through one small adapter.

An AccUDNN strategy has an ``offload_config`` (an :class:`~lightning_accudnn.OffloadConfig`)
and, once set up, its :class:`~lightning_accudnn.OffloadSession` as ``offload``: budget,
reserve, plan, stats and how its ranks agree on plans are read there, through public
attributes only. Any other strategy has no budget: the tuner then learns which sizes fit
by running them. ``callbacks`` does not import ``strategy`` (see docs/design.md, Layout), so the
strategy is recognised by what it has.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from torch.nn.parallel import DistributedDataParallel

from lightning_accudnn.planner import Plan
from lightning_accudnn.session import OffloadConfig, OffloadSession

__all__ = ["StrategyView"]


class StrategyView:
    """Budget, reserve, plan and last step's figures of an AccUDNN strategy (``None`` elsewhere).

    Example:
        >>> from lightning_accudnn import AccUDNNStrategy
        >>> view = StrategyView(AccUDNNStrategy(budget="2GB"))
        >>> view.is_offloading, view.budget_bytes  # the budget is resolved at setup
        (True, None)
    """

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.is_offloading = isinstance(getattr(strategy, "offload_config", None), OffloadConfig)
        """True for a strategy with a memory budget and a swap planner."""

    @property
    def on_whole_model_route(self) -> bool:
        """True when the strategy's config switches the experimental whole-model route on."""
        config = getattr(self.strategy, "offload_config", None)
        return isinstance(config, OffloadConfig) and config.whole_model_compile is not None

    @property
    def session(self) -> OffloadSession | None:
        """The strategy's offload session (``None`` before setup and for other strategies)."""
        session = getattr(self.strategy, "offload", None) if self.is_offloading else None
        return session if isinstance(session, OffloadSession) else None

    @property
    def is_supported(self) -> bool:
        """Single-device and DDP strategies (the tuner unwraps DDP while it searches).

        DeepSpeed derives from Lightning's DDP strategy but wraps model and optimizer in its
        own engine, whose state the tuner cannot put back: not supported.
        """
        if "DeepSpeed" in type(self.strategy).__name__:
            return False
        return isinstance(self.strategy, (SingleDeviceStrategy, DDPStrategy))

    @property
    def runs_alone(self) -> bool:
        """True when a trial step involves no collective: one process, or DDP's wrapper removable."""
        model = self.strategy.model
        if getattr(self.strategy, "world_size", 1) <= 1 or model is self.strategy.lightning_module:
            return True
        return isinstance(model, DistributedDataParallel)

    @property
    def budget_bytes(self) -> int | None:
        session = self.session
        return None if session is None else session.budget_bytes

    @property
    def reserve_bytes(self) -> int:
        session = self.session
        return 0 if session is None else session.reserve_bytes

    def smallest_budget_bytes(self, usable_bytes: int) -> int:
        """The budget the strategy would need for plans using ``usable_bytes`` (its session's
        :meth:`~lightning_accudnn.session.OffloadSession.smallest_budget_bytes`; without a
        session, ``usable_bytes`` and no reserve)."""
        session = self.session
        return usable_bytes if session is None else session.smallest_budget_bytes(usable_bytes)

    @property
    def plan(self) -> Plan | None:
        session = self.session
        return None if session is None else session.plan

    def wait_for_plans(self) -> None:
        """Wait for (and adopt) the plans the session makes in the background, if any."""
        session = self.session
        if session is not None:
            session.wait_for_plans()

    @property
    def peak_bytes(self) -> int | None:
        """Peak device bytes of the last training step, as the strategy measured it."""
        session = self.session
        stats = None if session is None else session.stats
        return None if stats is None else int(stats.peak_device_bytes)

    @contextmanager
    def planning_alone(self) -> Iterator[None]:
        """Within the block every rank plans from its own profile, with no collectives.

        A rank that runs out of memory mid-step must not leave the others waiting in the
        planner's all-reduce; the tuner's own agreement after each trial replaces it.
        """
        session = self.session
        if session is None:
            yield
            return
        with session.planning_alone():
            yield

    def abort_step(self, error: BaseException) -> None:
        """A trial step failed: let the strategy drop what the step left behind."""
        hook: Any = getattr(self.strategy, "on_exception", None)
        if hook is not None:
            hook(error)
