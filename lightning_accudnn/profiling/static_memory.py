"""Static memory of a training step: what stays on the device whatever is swapped."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def model_state_bytes(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> int:
    """Bytes of parameters, their gradients (present during backward), buffers and optimizer state.

    Storages are counted once (tied weights, views). Gradients are counted for every
    parameter that requires grad, whether or not ``.grad`` exists yet, because backward
    allocates them before the step ends. Optimizer state counts what exists on its parameter's
    device (Adam's step counters live on the CPU by default); for a parameter whose state is not
    created yet (before the first step) it counts what the optimizer will create
    (:func:`optimizer_state_to_come_bytes`), so that a plan made before the first update still
    fits after it.

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
    optimizers = tuple(optimizers)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                state = optimizer.state.get(parameter)
                if state:
                    total += sum(
                        once(value)
                        for value in state.values()
                        if isinstance(value, torch.Tensor) and value.device == parameter.device
                    )
    return total + optimizer_state_to_come_bytes(optimizers)


def optimizer_state_to_come_bytes(optimizers: Iterable[torch.optim.Optimizer]) -> int:
    """Bytes of optimizer state not created yet that :func:`model_state_bytes` counts: what each
    optimizer will create (:func:`expected_state_copies`) for its trainable parameters without
    state, at its first step, and the step counter of each (a float32 scalar) where it is made on
    the parameter's device (a CPU parameter's, or a ``capturable`` or ``fused`` group's), for
    every optimizer but SGD. A step before it holds that much less than its model state counts.

    Example:
        >>> parameter = torch.zeros(10, requires_grad=True)
        >>> optimizer = torch.optim.Adam([parameter])
        >>> optimizer_state_to_come_bytes([optimizer])  # two moments of 10 floats, a step counter
        84
        >>> parameter.grad = torch.ones(10); optimizer.step()
        >>> optimizer_state_to_come_bytes([optimizer])
        0
    """
    total = 0
    for optimizer in optimizers:
        copies = expected_state_copies(optimizer)
        counted = not isinstance(optimizer, torch.optim.SGD)
        for group in optimizer.param_groups:
            on_device = group.get("capturable") or group.get("fused")
            for parameter in group["params"]:
                if parameter.requires_grad and not optimizer.state.get(parameter):
                    total += copies * parameter.nbytes
                    if counted and (on_device or parameter.device.type == "cpu"):
                        total += _STEP_COUNTER_BYTES
    return total


#: A step counter in the optimizer's state: a float32 scalar tensor (``torch/optim/adam.py``).
_STEP_COUNTER_BYTES = 4


#: Optimizers by name (the ``accudnn plan --optimizer`` choices) and the settings that size
#: their state, for :func:`state_copies`.
NAMED_OPTIMIZERS: dict[str, tuple[str, dict[str, bool]]] = {
    "adam": ("adam", {}),
    "adamw": ("adam", {}),
    "sgd": ("sgd", {}),
    "sgd-momentum": ("sgd", {"momentum": True}),
    "none": ("none", {}),
}


def state_copies(kind: str, *, momentum: bool = False, amsgrad: bool = False, centered: bool = False) -> int:
    """Parameter-sized state tensors an optimizer keeps per trainable parameter: the one model.

    ``kind``: ``"sgd"`` (one momentum buffer if ``momentum``, else none), ``"adam"`` (two
    moments, three with ``amsgrad``), ``"rmsprop"`` (one, plus one each for ``momentum`` and
    ``centered``), ``"adagrad"`` (one), ``"none"``; anything else is assumed Adam-like (two),
    which errs on the safe side for most.

    Example:
        >>> state_copies("sgd"), state_copies("sgd", momentum=True), state_copies("adam")
        (0, 1, 2)
    """
    if kind == "sgd":
        return int(momentum)
    if kind == "adam":
        return 2 + int(amsgrad)
    if kind == "rmsprop":
        return 1 + int(momentum) + int(centered)
    if kind == "adagrad":
        return 1
    if kind == "none":
        return 0
    return 2


def named_state_copies(name: str) -> int:
    """:func:`state_copies` of a named optimizer (:data:`NAMED_OPTIMIZERS`).

    Example:
        >>> named_state_copies("sgd-momentum")
        1
    """
    kind, settings = _named(name)
    return state_copies(kind, **settings)


def named_step_temporaries_bytes(name: str, trainable_bytes: int) -> int:
    """What the multi-tensor step (PyTorch's default on CUDA) of a named optimizer
    (:data:`NAMED_OPTIMIZERS`) holds beside its state for ``trainable_bytes`` of trainable
    parameters, without weight decay (:func:`step_temporary_lists`).

    Example:
        >>> named_step_temporaries_bytes("adamw", 400), named_step_temporaries_bytes("sgd-momentum", 400)
        (400, 0)
    """
    kind, _ = _named(name)
    return step_temporary_lists(kind) * trainable_bytes


def _named(name: str) -> tuple[str, dict[str, bool]]:
    """The kind and settings of a named optimizer; an unknown name is refused, saying which are known."""
    key = name.lower()
    if key not in NAMED_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(NAMED_OPTIMIZERS)}")
    return NAMED_OPTIMIZERS[key]


def step_temporary_lists(kind: str, *, weight_decay: bool = False, maximize: bool = False) -> int:
    """Lists of one parameter-sized tensor per parameter that the multi-tensor step of an optimizer
    of ``kind`` holds at once beside its state, as PyTorch makes them (``torch/optim/adam.py``,
    ``sgd.py``): ``"adam"`` one (the square roots of the second moments), ``"sgd"`` one with
    ``weight_decay`` or ``maximize`` (its gradients made anew), else none; other kinds none (their
    steps are measured from the first on).

    Example:
        >>> step_temporary_lists("adam"), step_temporary_lists("sgd")
        (1, 0)
        >>> step_temporary_lists("sgd", weight_decay=True)
        1
    """
    if kind == "adam":
        return 1
    if kind == "sgd":
        return int(weight_decay or maximize)
    return 0


def expected_state_copies(optimizer: torch.optim.Optimizer) -> int:
    """Parameter-sized state tensors ``optimizer`` keeps per parameter once it has stepped,
    read from its settings (:func:`state_copies`).

    Example:
        >>> expected_state_copies(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9))
        1
    """
    defaults = optimizer.defaults
    momentum = bool(defaults.get("momentum", 0))
    if isinstance(optimizer, torch.optim.SGD):
        return state_copies("sgd", momentum=momentum)
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return state_copies("adam", amsgrad=bool(defaults.get("amsgrad")))
    if isinstance(optimizer, torch.optim.RMSprop):
        return state_copies("rmsprop", momentum=momentum, centered=bool(defaults.get("centered")))
    if isinstance(optimizer, torch.optim.Adagrad):
        return state_copies("adagrad")
    return state_copies(type(optimizer).__name__.lower())


def optimizer_step_temporaries_bytes(optimizers: Iterable[torch.optim.Optimizer]) -> int:
    """The most bytes an optimizer's step holds at once beside the parameters, their gradients
    and its state, before it ever stepped (a session measures it from the first step on), as
    PyTorch's own Adam, AdamW and SGD make them (``torch/optim/adam.py``, ``sgd.py``): their
    multi-tensor path, the default on CUDA (``foreach``), makes a list of one tensor per parameter
    of a group (Adam the square roots of its second moments, SGD its gradients plus weight decay
    or negated), and keeps one at a time; the loop over single tensors makes up to three of one
    parameter's size at once; the fused kernels none. Other optimizers: 0.

    Example:
        >>> weight = torch.zeros(100, requires_grad=True)
        >>> optimizer_step_temporaries_bytes([torch.optim.Adam([weight], foreach=True)])  # 100 floats
        400
        >>> optimizer_step_temporaries_bytes([torch.optim.SGD([weight], lr=0.1, foreach=True)])
        0
    """
    most = 0
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            lists = _temporary_lists(optimizer, group)
            trainable = [parameter for parameter in group["params"] if parameter.requires_grad]
            if not lists or not trainable or group.get("fused"):
                continue
            foreach = group.get("foreach")
            if foreach is None:  # PyTorch's default: on CUDA, not on the CPU
                foreach = all(parameter.is_cuda for parameter in trainable)
            if foreach:
                most = max(most, lists * sum(parameter.nbytes for parameter in trainable))
            else:
                most = max(most, 3 * max(parameter.nbytes for parameter in trainable))
    return most


def _temporary_lists(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> int:
    """:func:`step_temporary_lists` of ``optimizer``'s kind, for ``group``'s settings."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return step_temporary_lists("adam")
    if isinstance(optimizer, torch.optim.SGD):
        return step_temporary_lists(
            "sgd", weight_decay=bool(group.get("weight_decay")), maximize=bool(group.get("maximize"))
        )
    return 0
