"""Static memory of a training step: what stays on the device whatever is swapped."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def model_state_bytes(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> int:
    """Bytes of parameters, their gradients (present during backward), buffers and optimizer state.

    Storages are counted once (tied weights, views). Gradients are counted for every
    parameter that requires grad, whether or not ``.grad`` exists yet, because backward
    allocates them before the step ends. Optimizer state counts what exists; for a
    parameter whose state is not created yet (before the first step) it counts what the
    optimizer will create (:func:`expected_state_copies`), so that a plan made before the
    first update still fits after it.

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
        copies = expected_state_copies(optimizer)
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                state = optimizer.state.get(parameter)
                if state:
                    total += sum(once(value) for value in state.values() if isinstance(value, torch.Tensor))
                elif parameter.requires_grad:
                    total += copies * parameter.nbytes
    return total


def expected_state_copies(optimizer: torch.optim.Optimizer) -> int:
    """Parameter-sized state tensors ``optimizer`` keeps per parameter once it has stepped.

    Known optimizers are read from their settings (SGD: one if momentum is used; Adam and
    AdamW: two, three with amsgrad; RMSprop: one, plus one each for momentum and centered;
    Adagrad: one). Any other optimizer is assumed Adam-like (two), which errs on the safe
    side for most.

    Example:
        >>> expected_state_copies(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9))
        1
    """
    defaults = optimizer.defaults
    if isinstance(optimizer, torch.optim.SGD):
        return int(bool(defaults.get("momentum", 0)))
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 3 if defaults.get("amsgrad") else 2
    if isinstance(optimizer, torch.optim.RMSprop):
        return 1 + int(bool(defaults.get("momentum", 0))) + int(bool(defaults.get("centered")))
    if isinstance(optimizer, torch.optim.Adagrad):
        return 1
    return 2
