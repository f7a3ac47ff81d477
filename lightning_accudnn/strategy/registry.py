"""Names the Trainer understands once ``lightning_accudnn`` is imported."""

from __future__ import annotations

from lightning.pytorch.strategies import StrategyRegistry

from lightning_accudnn.strategy.single_device import AccUDNNStrategy


def register_strategies() -> None:
    """Register ``"accudnn"`` (budget ``"auto"``); safe to call more than once.

    Example:
        >>> register_strategies()
        >>> "accudnn" in StrategyRegistry
        True
    """
    if AccUDNNStrategy.strategy_name not in StrategyRegistry:
        StrategyRegistry.register(
            AccUDNNStrategy.strategy_name,
            AccUDNNStrategy,
            description="Single device, saved activations swapped to host memory under a budget (AccUDNN)",
            budget="auto",
        )
