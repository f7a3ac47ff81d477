"""No offload under the CUDA allocator cap AccUDNN sets: the deepest-model search's baseline.

Example:
    >>> Capped(8_000_000_000).prepare(None, None, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    RuntimeError: a memory cap without offload needs CUDA (the CPU has no allocator cap)
"""

from __future__ import annotations

import torch
from torch import nn

from bench.techniques.base import Technique


class Capped(Technique):
    """No offload, with the CUDA caching allocator capped at ``budget_bytes`` (as AccUDNN caps it).

    On CPU there is nothing to cap, so it refuses.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.device: torch.device | None = None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        if device.type != "cuda":
            raise RuntimeError("a memory cap without offload needs CUDA (the CPU has no allocator cap)")
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, self.budget_bytes / total), device)
        self.device = device
        return model

    def teardown(self) -> None:
        if self.device is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            self.device = None
