"""The tests' one reader of private PyTorch attributes: how many module and parameter hooks are
installed, and the default process group's store."""

from typing import Any

import torch
from torch import nn


def module_hook_count(model: nn.Module) -> int:
    """Forward pre-hooks plus forward hooks over every submodule of ``model``."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def post_accumulate_grad_hook_count(model: nn.Module) -> int:
    """Post-accumulate-grad hooks over every parameter of ``model``."""
    return sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())


def forward_pre_hook_count(module: nn.Module) -> int:
    return len(module._forward_pre_hooks)


def default_process_group_store() -> Any:
    """The key-value store the ranks of the default process group rendezvoused through."""
    return torch.distributed.distributed_c10d._get_default_store()
