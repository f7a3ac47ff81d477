"""Static memory of a training step: what stays on the device whatever is swapped."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def model_state_bytes(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> int:
    """Bytes of parameters, their gradients (present during backward), buffers and optimizer state.

    Storages are counted once (tied weights, views). Gradients are counted for every
    parameter that requires grad, whether or not ``.grad`` exists yet, because backward
    allocates them before the step ends. Optimizer state counts what exists now: Adam's
    moments appear after its first step.

    Example:
        >>> model = nn.Linear(10, 10)  # 110 fp32 parameters
        >>> model_state_bytes(model)
        880
    """
    seen: set[int] = set()

    def once(tensor: torch.Tensor) -> int:
        key = tensor.untyped_storage().data_ptr()
        if key in seen or tensor.device.type == "meta":
            return 0
        seen.add(key)
        return tensor.untyped_storage().nbytes()

    total = 0
    for parameter in model.parameters():
        size = once(parameter)
        total += size
        if parameter.requires_grad:
            total += size if parameter.grad is None else once(parameter.grad)
    total += sum(once(buffer) for buffer in model.buffers())
    for optimizer in optimizers:
        for state in optimizer.state.values():
            total += sum(once(value) for value in state.values() if isinstance(value, torch.Tensor))
    return total
