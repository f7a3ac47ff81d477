"""Names the Trainer understands once ``lightning_accudnn`` is imported."""

from __future__ import annotations

from lightning.pytorch.strategies import StrategyRegistry

from lightning_accudnn.strategy.ddp import AccUDNNDDPStrategy
from lightning_accudnn.strategy.single_device import AccUDNNStrategy

#: DDP variants, named like Lightning's own: name -> process start method.
DDP_START_METHODS = {
    "accudnn_ddp": "popen",
    "accudnn_ddp_spawn": "spawn",
    "accudnn_ddp_fork": "fork",
    "accudnn_ddp_notebook": "fork",
}


def register_strategies() -> None:
    """Register ``"accudnn"`` and the ``"accudnn_ddp*"`` names (budget ``"auto"``); idempotent.

    Example:
        >>> register_strategies()
        >>> "accudnn" in StrategyRegistry and "accudnn_ddp_spawn" in StrategyRegistry
        True
    """
    if AccUDNNStrategy.strategy_name not in StrategyRegistry:
        StrategyRegistry.register(
            AccUDNNStrategy.strategy_name,
            AccUDNNStrategy,
            description="Single device, saved activations swapped to host memory under a budget (AccUDNN)",
            budget="auto",
        )
    for name, start_method in DDP_START_METHODS.items():
        if name not in StrategyRegistry:
            StrategyRegistry.register(
                name,
                AccUDNNDDPStrategy,
                description=f"DDP ({start_method}) with AccUDNN activation swapping on every rank",
                budget="auto",
                start_method=start_method,
            )
