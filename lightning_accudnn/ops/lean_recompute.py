"""Checkpoint a whole segment with little Python per saved tensor.

Non-reentrant ``torch.utils.checkpoint`` spends most of a recomputing step's host time on its
own bookkeeping per saved tensor (a holder object and a weak reference per save, weak-key
dictionaries, ``no_grad`` blocks and ``torch._dynamo.disable`` wrappers around its hooks); on
a GPU whose kernels are short the step waits for that Python. :func:`lean_checkpoint` keeps
the same contract for the plain eager case with a list per recomputation:

* in forward the segment's tensor inputs are saved through the saved-tensor hooks in force
  (the engine's: it keeps or swaps them), and each tensor the segment saves is replaced by
  its index (with its shape, dtype and device, for the determinism check);
* the first unpack of a graph task (a backward) runs the forward again from those inputs,
  under the RNG states (CPU, and the inputs' CUDA devices) and the autocast state of the call,
  with grad enabled, inside the segment's recomputation context; each save is captured at its
  index, and the recomputation stops once all are; each unpack hands its tensor over and
  forgets it. Another graph task (``retain_graph``) recomputes again; an unpack outside a
  backward recomputes for itself;
* a recomputation that saves fewer tensors, or tensors of another shape, dtype or device,
  raises ``torch.utils.checkpoint.CheckpointError``, as ``torch.utils.checkpoint`` does.

:func:`lean_possible` says when the caller may take it: no torch function or dispatch mode, no
compilation or FX tracing, and not inside ``torch.utils.checkpoint``'s own hooks; otherwise
the caller uses ``torch.utils.checkpoint``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointError, get_device_states, set_device_states

from lightning_accudnn.ops._torch_internals import (
    STOP_RECOMPUTATION,
    current_graph_task,
    fx_tracing,
    inside_checkpoint_hooks,
    modes_active,
)

__all__ = ["lean_checkpoint", "lean_possible", "save_inputs", "saved_inputs"]

#: Autocast's state at a call, per device type: (enabled, dtype, cache enabled).
_Autocast = tuple[bool, torch.dtype, bool]


def lean_possible() -> bool:
    """Whether :func:`lean_checkpoint` may checkpoint a call made now (the plain eager case).

    Example:
        >>> lean_possible()
        True
    """
    return not (modes_active() or torch.compiler.is_compiling() or fx_tracing() or inside_checkpoint_hooks())


class _SaveInputs(torch.autograd.Function):
    """Saves the segment's tensor inputs through the hooks in force; its output (never part of
    the loss's graph) holds the node that holds them."""

    @staticmethod
    def forward(ctx: Any, dummy: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*tensors)
        return dummy.new_empty(())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, ...]:
        return (None,) * (1 + len(ctx.saved_tensors))


_DUMMY = torch.empty(0, requires_grad=True)


def save_inputs(tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A placeholder whose autograd node saves ``tensors`` through the saved-tensor hooks in
    force (it is never part of the loss's graph, so no backward frees them): how a checkpoint
    keeps its inputs, as ``torch.utils.checkpoint`` does. :func:`saved_inputs` unpacks them.

    Example:
        >>> x = torch.randn(2, requires_grad=True)
        >>> saved_inputs(save_inputs((x,)))[0] is x
        True
    """
    placeholder: torch.Tensor = _SaveInputs.apply(_DUMMY, *tensors)
    return placeholder


def saved_inputs(placeholder: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors :func:`save_inputs` saved in ``placeholder``, through the hooks that saved them."""
    node = placeholder.grad_fn
    assert node is not None
    saved: tuple[torch.Tensor, ...] = node.saved_tensors  # type: ignore[attr-defined]
    return saved


def _autocast(device_type: str) -> _Autocast:
    return (
        torch.is_autocast_enabled(device_type),
        torch.get_autocast_dtype(device_type),
        torch.is_autocast_cache_enabled(),
    )


class _Frame:
    """One checkpointed call: what it saved (how many, their metadata) and how to run it again."""

    __slots__ = (
        "function",
        "context",
        "saver",
        "metadata",
        "cpu_state",
        "devices",
        "device_states",
        "device_type",
        "device_autocast",
        "cpu_autocast",
        "by_task",
    )

    def __init__(
        self,
        function: Callable[..., Any],
        context: Callable[[], contextlib.AbstractContextManager[Any]],
        device_type: str,
        tensors: tuple[torch.Tensor, ...],
    ) -> None:
        self.function = function
        self.context = context
        self.metadata: list[tuple[torch.Size, torch.dtype, torch.device]] = []
        self.device_type = device_type
        self.cpu_state = torch.get_rng_state()
        self.devices: list[int] = []
        self.device_states: list[torch.Tensor] = []
        if device_type == "cuda" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            self.devices, self.device_states = get_device_states(*tensors)
        available = torch.amp.is_autocast_available(device_type)
        self.device_autocast = _autocast(device_type) if available else None
        self.cpu_autocast = _autocast("cpu")
        self.saver: torch.Tensor | None = None
        # graph task -> [its recomputed saves (None once unpacked), how many are left]
        self.by_task: dict[int, list[Any]] = {}

    def pack(self, tensor: torch.Tensor) -> int:
        metadata = self.metadata
        metadata.append((tensor.shape, tensor.dtype, tensor.device))
        return len(metadata) - 1

    def unpack(self, index: int) -> torch.Tensor:
        task = current_graph_task()
        entry = self.by_task.get(task)
        if entry is None:
            if task == -1:  # outside a backward: recomputed for this unpack alone
                value = self._recompute()[index]
                assert value is not None
                return value
            entry = self.by_task[task] = [self._recompute(), len(self.metadata)]
        values: list[torch.Tensor | None] = entry[0]
        value = values[index]
        if value is None:
            raise CheckpointError(
                "lean checkpoint: a saved tensor was unpacked twice in one backward (its graph "
                "freed it, or it was read again)"
            )
        values[index] = None
        left = entry[1] = entry[1] - 1
        if not left:
            del self.by_task[task]
        return value

    def _recompute(self) -> list[torch.Tensor | None]:
        assert self.saver is not None
        inputs = saved_inputs(self.saver)
        metadata = self.metadata
        saves = len(metadata)
        values: list[torch.Tensor | None] = []
        seen: list[tuple[torch.Size, torch.dtype, torch.device]] = []
        keep, note = values.append, seen.append

        def capture(tensor: torch.Tensor) -> torch.Tensor:
            note((tensor.shape, tensor.dtype, tensor.device))
            keep(tensor.detach() if tensor.requires_grad else tensor)
            if len(values) >= saves:  # all of them: the rest of the forward need not run
                raise STOP_RECOMPUTATION
            return tensor

        device_type = self.device_type
        autocast = self.device_autocast
        device_autocast = (
            contextlib.nullcontext()
            if autocast is None
            else torch.amp.autocast(
                device_type=device_type, enabled=autocast[0], dtype=autocast[1], cache_enabled=autocast[2]
            )
        )
        enabled, dtype, cache = self.cpu_autocast
        with (
            torch.autograd.graph.saved_tensors_hooks(capture, _same),
            torch.enable_grad(),
            torch.random.fork_rng(devices=self.devices, device_type=device_type),
        ):
            torch.set_rng_state(self.cpu_state)
            if self.devices:
                set_device_states(self.devices, self.device_states, device_type=device_type)
            with (
                device_autocast,
                torch.amp.autocast("cpu", enabled=enabled, dtype=dtype, cache_enabled=cache),
                self.context(),
                contextlib.suppress(STOP_RECOMPUTATION),
            ):
                self.function(*inputs)
        if seen != metadata:
            if len(seen) != saves:
                raise CheckpointError(
                    f"lean checkpoint: the forward saved {saves} tensors, its recomputation {len(seen)}"
                )
            index = next(i for i, (was, now) in enumerate(zip(metadata, seen, strict=True)) if was != now)
            raise CheckpointError(
                f"lean checkpoint: saved tensor {index} was {metadata[index]} in forward, "
                f"{seen[index]} recomputed"
            )
        return values


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def lean_checkpoint(
    function: Callable[..., Any],
    tensors: tuple[torch.Tensor, ...],
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Any:
    """``function(*tensors)``, what it saves rebuilt in backward by calling it again (under
    ``context()``) from the ``tensors`` saved through the hooks in force.

    Example:
        >>> x = torch.randn(3, requires_grad=True)
        >>> y = lean_checkpoint(lambda t: torch.nn.functional.dropout(t.sin(), 0.5), (x,))
        >>> y.sum().backward()
        >>> expected = torch.where(y != 0, 2 * x.cos(), 0).detach()
        >>> torch.equal(x.grad, expected)
        True
    """
    device_type = "cpu"
    for tensor in tensors:
        if not tensor.is_cpu:
            device_type = tensor.device.type
            break
    frame = _Frame(function, context, device_type, tensors)
    frame.saver = save_inputs(tensors)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return function(*tensors)
