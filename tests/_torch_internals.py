"""The tests' one reader of private PyTorch attributes: how many module hooks are installed."""

from torch import nn


def module_hook_count(model: nn.Module) -> int:
    """Forward pre-hooks plus forward hooks over every submodule of ``model``."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def forward_pre_hook_count(module: nn.Module) -> int:
    return len(module._forward_pre_hooks)
