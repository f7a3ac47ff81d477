"""What the tuner needs to know about the Trainer's strategy, read through one small adapter.

An AccUDNN strategy exposes ``plan`` and ``stats``; its budget, reserve and the way its
ranks agree on plans live on the offload controller it holds. Any other strategy has no
budget: the tuner then learns which sizes fit by running them. ``callbacks`` does not
import ``strategy`` (see DESIGN.md), so the strategy is recognised by what it has.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from torch.nn.parallel import DistributedDataParallel

from lightning_accudnn.planner import Plan
from lightning_accudnn.planner.coordination import RankCoordinator

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
        self._controller = getattr(strategy, "_controller", None)
        needed = ("budget_bytes", "reserve_bytes", "plan", "stats", "coordinator")
        if self._controller is not None and not all(hasattr(self._controller, n) for n in needed):
            self._controller = None

    @property
    def is_offloading(self) -> bool:
        """True for a strategy with a memory budget and a swap planner."""
        return self._controller is not None

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
        if self.strategy.world_size <= 1 or model is self.strategy.lightning_module:
            return True
        return isinstance(model, DistributedDataParallel)

    @property
    def budget_bytes(self) -> int | None:
        return None if self._controller is None else self._controller.budget_bytes

    @property
    def reserve_bytes(self) -> int:
        return 0 if self._controller is None else int(self._controller.reserve_bytes)

    @property
    def plan(self) -> Plan | None:
        return None if self._controller is None else self._controller.plan

    @property
    def peak_bytes(self) -> int | None:
        """Peak device bytes of the last training step, as the strategy measured it."""
        stats = None if self._controller is None else self._controller.stats
        return None if stats is None else int(stats.peak_device_bytes)

    @contextmanager
    def planning_alone(self) -> Iterator[None]:
        """Within the block every rank plans from its own profile, with no collectives.

        A rank that runs out of memory mid-step must not leave the others waiting in the
        planner's all-reduce; the tuner's own agreement after each trial replaces it.
        """
        if self._controller is None:
            yield
            return
        coordinator = self._controller.coordinator
        self._controller.coordinator = RankCoordinator()  # each rank plans on its own
        try:
            yield
        finally:
            self._controller.coordinator = coordinator

    def abort_step(self, error: BaseException) -> None:
        """A trial step failed: let the strategy drop what the step left behind."""
        hook: Any = getattr(self.strategy, "on_exception", None)
        if hook is not None:
            hook(error)
