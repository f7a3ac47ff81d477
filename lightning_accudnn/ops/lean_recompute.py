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
from operator import attrgetter
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointError

from lightning_accudnn.ops._torch_internals import (
    STOP_RECOMPUTATION,
    current_graph_task,
    dispatch_mode_depth,
    function_mode_depth,
    fx_tracing,
    innermost_saved_tensor_hooks,
    pop_saved_tensor_hooks,
    push_saved_tensor_hooks,
    set_grad_mode,
)

__all__ = ["lean_checkpoint", "lean_possible", "save_inputs", "saved_inputs"]

#: Autocast's state at a call, per device type: (enabled, dtype, cache enabled).
_Autocast = tuple[bool, torch.dtype, bool]
#: What the determinism check compares per saved tensor: its shape, dtype and device.
_Metadata = tuple[torch.Size, torch.dtype, torch.device]

_metadata: Callable[[torch.Tensor], _Metadata] = attrgetter("shape", "dtype", "device")
_cpu_generator = torch.default_generator
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


def lean_possible() -> bool:
    """Whether :func:`lean_checkpoint` may checkpoint a call made now (the plain eager case): no
    torch function or dispatch mode, no compilation or FX tracing, and not inside
    ``torch.utils.checkpoint``'s own hooks.

    Example:
        >>> lean_possible()
        True
    """
    if function_mode_depth() or dispatch_mode_depth() or _is_compiling() or fx_tracing():
        return False
    hooks = innermost_saved_tensor_hooks(False)
    return hooks is None or not getattr(hooks[0], "_checkpoint_internal", False)


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


_AUTOCAST_AVAILABLE: dict[str, bool] = {}


def _autocast_available(device_type: str) -> bool:
    available = _AUTOCAST_AVAILABLE.get(device_type)
    if available is None:
        available = _AUTOCAST_AVAILABLE[device_type] = torch.amp.is_autocast_available(device_type)
    return available


def _enter_autocast(device_type: str, state: _Autocast) -> _Autocast:
    """``torch.autocast``'s entry with ``state`` (the eager case: no mode is in force); the
    state before, for :func:`_exit_autocast`."""
    before = _autocast(device_type)
    enabled, dtype, cache = state
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(cache)
    return before


def _exit_autocast(device_type: str, before: _Autocast) -> None:
    """``torch.autocast``'s exit back to ``before`` (its cache dropped at the outermost exit)."""
    if torch.autocast_decrement_nesting() == 0:
        torch.clear_autocast_cache()
    enabled, dtype, cache = before
    torch.set_autocast_enabled(device_type, enabled)
    torch.set_autocast_dtype(device_type, dtype)
    torch.set_autocast_cache_enabled(cache)


class _CudaRng:
    """The RNG states of the CUDA devices of a call's tensors: their default generators, read
    and set as ``torch.cuda.get_rng_state`` and ``set_rng_state`` do once CUDA is initialised."""

    __slots__ = ("generators", "states")

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        devices = dict.fromkeys(tensor.get_device() for tensor in tensors if tensor.is_cuda)
        generators = torch.cuda.default_generators
        self.generators = [generators[index] for index in devices]
        self.states = self.now()

    def now(self) -> list[torch.Tensor]:
        return [generator.get_state() for generator in self.generators]

    def set(self, states: list[torch.Tensor]) -> None:
        for generator, state in zip(self.generators, states, strict=True):
            generator.set_state(state)


class _Frame:
    """One checkpointed call: what it saved (how many, their metadata) and how to run it again.

    The recomputed saves of the graph task (backward) that unpacked last are in ``values``, by
    index, until each is unpacked; another task's, while tasks interleave, in ``others``.
    """

    __slots__ = (
        "function",
        "context",
        "saver",
        "metadata",
        "cpu_state",
        "device_rng",
        "device_type",
        "device_autocast",
        "cpu_autocast",
        "task",
        "values",
        "others",
    )

    def __init__(
        self,
        function: Callable[..., Any],
        context: contextlib.AbstractContextManager[Any] | None,
        tensors: tuple[torch.Tensor, ...],
    ) -> None:
        self.function = function
        self.context = context
        self.metadata: list[_Metadata] = []
        self.cpu_state = _cpu_generator.get_state()
        device_type = "cpu"
        for tensor in tensors:
            if not tensor.is_cpu:
                device_type = tensor.device.type
                break
        self.device_type = device_type
        self.device_rng: _CudaRng | None = None
        self.device_autocast: _Autocast | None = None
        if device_type != "cpu":
            if device_type == "cuda" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
                self.device_rng = _CudaRng(tensors)
            if _autocast_available(device_type):
                self.device_autocast = _autocast(device_type)
        self.cpu_autocast = _autocast("cpu")
        self.task: int | None = None
        self.values: dict[int, torch.Tensor] = {}
        self.others: dict[int, dict[int, torch.Tensor]] | None = None
        self.saver = save_inputs(tensors)

    def unpack(self, index: int) -> torch.Tensor:
        if current_graph_task() != self.task:
            return self._unpack_in_another_task(index)
        try:
            return self.values.pop(index)
        except KeyError:
            raise CheckpointError(
                "lean checkpoint: a saved tensor was unpacked twice in one backward (its graph "
                "freed it, or it was read again)"
            ) from None

    def _unpack_in_another_task(self, index: int) -> torch.Tensor:
        """The first unpack of a graph task (its saves recomputed, or taken back from where they
        were kept while another task unpacked), or an unpack outside a backward (recomputed for
        itself alone)."""
        task = current_graph_task()
        if task == -1:
            return self._recompute()[index]
        values, previous = self.values, self.task
        if values and previous is not None:  # that task has saves left: kept while tasks interleave
            if self.others is None:
                self.others = {}
            self.others[previous] = values
        others = self.others
        kept = None if others is None else others.pop(task, None)
        self.task, self.values = task, self._recompute() if kept is None else kept
        return self.unpack(index)

    def _recompute(self) -> dict[int, torch.Tensor]:
        assert self.saver is not None
        inputs = saved_inputs(self.saver)
        metadata = self.metadata
        saves = len(metadata)
        captured: list[torch.Tensor] = []
        keep = captured.append

        def capture(tensor: torch.Tensor) -> torch.Tensor:
            # Detached: what is kept, and what the recomputation's graph holds for it (the tensor
            # itself, where it is its node's own output, would hold that node: a reference cycle
            # through autograd that no collector frees, every recomputation).
            value = tensor.detach() if tensor.requires_grad else tensor
            keep(value)
            if len(captured) == saves:  # all of them: the rest of the forward need not run
                raise STOP_RECOMPUTATION
            return value

        device_type, device_rng = self.device_type, self.device_rng
        # Autocast is set only where its state differs from the call's (entering the same
        # state again changes nothing the recomputation computes).
        device_autocast = self.device_autocast
        if device_autocast is not None and _autocast(device_type) == device_autocast:
            device_autocast = None
        cpu_autocast: _Autocast | None = self.cpu_autocast
        if _autocast("cpu") == cpu_autocast:
            cpu_autocast = None
        grad_before = _grad_enabled()
        cpu_before = _cpu_generator.get_state()
        device_before = None if device_rng is None else device_rng.now()
        try:
            push_saved_tensor_hooks(capture, _same)
            try:
                set_grad_mode(True)
                _cpu_generator.set_state(self.cpu_state)
                if device_rng is not None:
                    device_rng.set(device_rng.states)
                self._run_again(inputs, device_autocast, cpu_autocast)
            finally:
                pop_saved_tensor_hooks()
                set_grad_mode(grad_before)
                _cpu_generator.set_state(cpu_before)
                if device_before is not None:
                    assert device_rng is not None
                    device_rng.set(device_before)
        except STOP_RECOMPUTATION:  # caught once the hooks, grad mode and RNG are back, as torch does
            pass
        seen = list(map(_metadata, captured))
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
        return dict(enumerate(captured))

    def _run_again(
        self,
        inputs: tuple[torch.Tensor, ...],
        device_autocast: _Autocast | None,
        cpu_autocast: _Autocast | None,
    ) -> None:
        """The call run again from ``inputs``, under the call's autocast states where they differ
        from the ones now (``None``: the same) and inside its context."""
        device_type, context = self.device_type, self.context
        device_before = None if device_autocast is None else _enter_autocast(device_type, device_autocast)
        try:
            cpu_before = None if cpu_autocast is None else _enter_autocast("cpu", cpu_autocast)
            try:
                if context is None:
                    self.function(*inputs)
                else:
                    with context:
                        self.function(*inputs)
            finally:
                if cpu_before is not None:
                    _exit_autocast("cpu", cpu_before)
        finally:
            if device_before is not None:
                _exit_autocast(device_type, device_before)


def _packer(metadata: list[_Metadata]) -> Callable[[torch.Tensor], int]:
    """The forward's pack hook: each save's metadata appended to ``metadata``, its index returned."""

    def pack(
        tensor: torch.Tensor,
        count: Callable[[], int] = metadata.__len__,
        append: Callable[[_Metadata], None] = metadata.append,
        describe: Callable[[torch.Tensor], _Metadata] = _metadata,
    ) -> int:
        index = count()
        append(describe(tensor))
        return index

    return pack


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def lean_checkpoint(
    function: Callable[..., Any],
    tensors: tuple[torch.Tensor, ...],
    context: contextlib.AbstractContextManager[Any] | None = None,
) -> Any:
    """``function(*tensors)``, what it saves rebuilt in backward by calling it again (inside
    ``context``, which must allow being entered again and nested) from the ``tensors`` saved
    through the hooks in force.

    Example:
        >>> x = torch.randn(3, requires_grad=True)
        >>> y = lean_checkpoint(lambda t: torch.nn.functional.dropout(t.sin(), 0.5), (x,))
        >>> y.sum().backward()
        >>> expected = torch.where(y != 0, 2 * x.cos(), 0).detach()
        >>> torch.equal(x.grad, expected)
        True
    """
    frame = _Frame(function, context, tensors)
    push_saved_tensor_hooks(_packer(frame.metadata), frame.unpack)
    try:
        return function(*tensors)
    finally:
        pop_saved_tensor_hooks()
