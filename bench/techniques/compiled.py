"""``torch.compile`` under ``torch._functorch.config.activation_memory_budget``.

Example:
    >>> technique = Compile(0.5, backend="eager")
    >>> technique.patched
    False
"""

from __future__ import annotations

import torch
from torch import nn

from bench.techniques.base import Technique


class Compile(Technique):
    """``torch.compile(model, backend=...)`` with ``activation_memory_budget`` set while it runs."""

    def __init__(self, activation_memory_budget: float, backend: str) -> None:
        import torch._functorch.config as functorch_config

        self.backend = backend
        self.patch = functorch_config.patch(activation_memory_budget=activation_memory_budget)
        self.patched = False

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        self.patch.__enter__()
        self.patched = True
        return torch.compile(model, backend=self.backend)  # type: ignore[return-value]  # an OptimizedModule

    def teardown(self) -> None:
        if self.patched:
            self.patch.__exit__(None, None, None)
            self.patched = False
        import torch._dynamo

        torch._dynamo.reset()
