"""Full activation checkpointing: every block of the workload recomputed in backward.

Example:
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    >>> type(Checkpoint(["1"]).prepare(model, None, torch.device("cpu"))[1]).__name__
    'Checkpointed'
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.techniques.base import Technique


class Checkpointed(nn.Module):
    """Runs ``block`` under ``torch.utils.checkpoint`` (non-reentrant)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module, names: list[str]) -> nn.Module:
    """Replace each named block of ``model`` by a checkpointed wrapper (in place).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> type(checkpoint_blocks(model, ["1"])[1]).__name__
        'Checkpointed'
    """
    if not names:
        raise ValueError("the workload names no blocks to checkpoint")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Checkpointed(parent.get_submodule(child)))
    return model


class Checkpoint(Technique):
    """Every block named by the workload under non-reentrant ``torch.utils.checkpoint``."""

    def __init__(self, block_names: list[str]) -> None:
        self.block_names = block_names

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        return checkpoint_blocks(model, self.block_names)
