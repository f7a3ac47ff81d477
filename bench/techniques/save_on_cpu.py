"""PyTorch's own ``torch.autograd.graph.save_on_cpu``, counting the bytes its hooks copy.

Example:
    >>> technique = SaveOnCpu(pin_memory=False)
    >>> x = torch.ones(4, requires_grad=True)
    >>> with technique.forward_context(None, None, None):
    ...     loss = (x * x).sum()
    >>> loss.backward()
    >>> technique.step_figures()
    {'bytes_swapped_out': 32, 'bytes_swapped_in': 32}
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from bench.techniques.base import Technique
from bench.workloads import Batch


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """``save_on_cpu`` itself, with its hooks wrapped to count the bytes they copy."""

    def __init__(self, pin_memory: bool) -> None:
        super().__init__(pin_memory=pin_memory)
        self.bytes_out = 0
        self.bytes_in = 0
        pack, unpack = self.pack_hook, self.unpack_hook

        def counting_pack(tensor: torch.Tensor) -> Any:
            self.bytes_out += tensor.numel() * tensor.element_size()
            return pack(tensor)

        def counting_unpack(packed: Any) -> torch.Tensor:
            tensor = unpack(packed)
            self.bytes_in += tensor.numel() * tensor.element_size()
            return tensor

        self.pack_hook, self.unpack_hook = counting_pack, counting_unpack


class SaveOnCpu(Technique):
    """``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around forward.

    Called as PyTorch documents it (``device_type`` left at its default ``"cuda"``): on a
    machine without CUDA it copies every saved tensor to plain, unpinned host memory.
    """

    def __init__(self, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory
        self.hooks: CountingSaveOnCpu | None = None

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        self.hooks = CountingSaveOnCpu(self.pin_memory)
        return self.hooks

    def step_figures(self) -> dict[str, Any]:
        if self.hooks is None:
            return {}
        return {"bytes_swapped_out": self.hooks.bytes_out, "bytes_swapped_in": self.hooks.bytes_in}
