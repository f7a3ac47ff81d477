"""torchtune's ``OffloadActivations`` (pinned memory, streams) around forward, when installed.

Example:
    >>> try:
    ...     TorchtuneOffload()
    ... except ImportError:
    ...     pass  # the run records a "not_installed" row
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from bench.techniques.base import Technique
from bench.workloads import Batch


class TorchtuneOffload(Technique):
    """torchtune's ``OffloadActivations(use_pin_memory=True)`` around forward."""

    def __init__(self) -> None:
        from torchtune.training import OffloadActivations  # ImportError: the row says "not installed"

        self.factory = OffloadActivations

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        return self.factory(use_pin_memory=True)
