"""The interface every technique implements; the base class changes nothing (the oracle row).

Example:
    >>> technique = Technique()
    >>> technique.step_figures()
    {}
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from bench.measure import StepMemory
from bench.workloads import Batch


class Technique:
    """How one strategy changes a training step: prepare the model, wrap forward, run backward."""

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        return model

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> StepMemory | None:
        """Run backward; return a peak measured inside it when the allocator was reset there."""
        loss.backward()
        return None

    def recover(self, error: BaseException) -> bool:
        """Whether the step that raised ``error`` in forward or backward may run again (what
        the technique's own training integration does; none here)."""
        return False

    def release_failed_pass(self) -> None:
        """Once the error :meth:`recover` allowed is gone: free what the failed pass left."""

    def settled(self) -> bool:
        """Whether the steps to come run as the last one did (the technique changes nothing
        more about how it runs them): the warm-up may end. Asked after each warm-up step from
        the last one asked for on; what the technique still had to prepare is done by then."""
        return True

    def step_figures(self) -> dict[str, Any]:
        """Figures of the step just run (bytes swapped and the like)."""
        return {}

    def teardown(self) -> None:
        pass
