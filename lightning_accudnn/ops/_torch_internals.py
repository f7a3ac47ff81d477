"""Every use of a private PyTorch name in ``ops``, in one place."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from itertools import chain
from operator import attrgetter
from typing import Any

import torch
import torch.utils._python_dispatch
import torch.utils.checkpoint
from torch import nn

__all__ = [
    "fx_tracing",
    "function_mode_depth",
    "dispatch_mode_depth",
    "push_saved_tensor_hooks",
    "pop_saved_tensor_hooks",
    "innermost_saved_tensor_hooks",
    "set_grad_mode",
    "current_graph_task",
    "inside_checkpoint_hooks",
    "modes_active",
    "NORM_WITH_STATISTICS",
    "SELECTIVE_SAVES_THROUGH_HOOKS",
    "STOP_RECOMPUTATION",
    "TorchDispatchMode",
    "CurrentCudaStream",
    "StorageWeakReference",
    "buffers_of",
    "children_ids",
    "copy_each",
    "empty_host_cache",
    "submodules_of",
    "tracks_running_statistics",
    "top_saved_tensor_hooks",
    "written_arguments",
]


#: What non-reentrant checkpointing raises inside a recomputation to end it early, once every
#: saved tensor it needs is rebuilt: control flow, not a failure.
STOP_RECOMPUTATION: type[BaseException] = torch.utils.checkpoint._StopRecomputationError

#: Whether checkpointing can pass what selective checkpointing keeps through the saved-tensor
#: hooks in force (``respect_saved_tensors_hooks``), and replay a segment whole (``early_stop``,
#: so that every kept output is handed back through the hooks): then the engine sees (and
#: counts) it.
SELECTIVE_SAVES_THROUGH_HOOKS: bool = {"respect_saved_tensors_hooks", "early_stop"} <= set(
    inspect.signature(torch.utils.checkpoint.checkpoint).parameters
)

#: The base class of a mode that sees every ATen op (the selective probe's recorder).
TorchDispatchMode = torch.utils._python_dispatch.TorchDispatchMode

_WRITTEN: dict[object, tuple[tuple[int, str], ...]] = {}


def written_arguments(func: object) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of the arguments an ATen op overload writes in place (its schema's
    mutable aliases: ``relu_``'s ``self``, an ``out=`` tensor); none for anything else.

    Example:
        >>> written_arguments(torch.ops.aten.relu_.default), written_arguments(torch.ops.aten.relu.default)
        (((0, 'self'),), ())
    """
    known = _WRITTEN.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        arguments = () if schema is None else schema.arguments
        known = _WRITTEN[func] = tuple(
            (i, argument.name)
            for i, argument in enumerate(arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
        )
    return known


class StorageWeakReference:
    """A weak reference to a storage: whether it has died, without keeping it alive.

    What ``torch.multiprocessing.reductions.StorageWeakRef`` does, as one object: that class
    keeps a bound method in each instance, a second object for the garbage collector to track;
    the engine makes one of these per saved storage and per copy brought back, every step.

    Example:
        >>> tensor = torch.zeros(4)
        >>> reference = StorageWeakReference(tensor.untyped_storage())
        >>> reference.expired(), reference.use_count()  # the tensor and the storage's Python object
        (False, 2)
        >>> del tensor
        >>> reference.expired()
        True
    """

    __slots__ = ("cdata",)
    _expired = torch.UntypedStorage._expired  # class attributes: still there at shutdown
    _free_weak_ref = torch.UntypedStorage._free_weak_ref
    _use_count = staticmethod(torch._C._storage_Use_Count)

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.cdata = int(storage._weak_ref())  # type: ignore[call-overload]

    def expired(self) -> bool:
        return bool(self._expired(self.cdata))

    def use_count(self) -> int:
        """The storage's strong references (tensors over it, its Python object), while alive."""
        return int(self._use_count(self.cdata))

    def __del__(self) -> None:
        self._free_weak_ref(self.cdata)  # type: ignore[no-untyped-call]


class CurrentCudaStream:
    """The current CUDA stream of one device: one :class:`torch.cuda.Stream`, reused while current.

    ``torch.cuda.current_stream(device)`` checks CUDA's initialisation, resolves the device and
    builds a new ``Stream`` at every call: on an H100 host that chain took more Python per
    swapped storage than any function of the engine (cProfile, 2026-11-23). This asks CUDA for
    the current stream's id only, and builds a ``Stream`` when the id changed.

    Example:
        >>> current = CurrentCudaStream(0)  # doctest: +SKIP
        >>> current.get() == torch.cuda.current_stream(0)  # doctest: +SKIP
        True
    """

    __slots__ = ("index", "_id", "_stream")

    def __init__(self, index: int) -> None:
        self.index = index
        self._id: int | None = None
        self._stream: torch.cuda.Stream | None = None

    def get(self) -> torch.cuda.Stream:
        stream_id, device_index, device_type = torch._C._cuda_getCurrentStream(self.index)
        stream = self._stream
        if stream is None or stream_id != self._id:
            stream = self._stream = torch.cuda.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type
            )  # type: ignore[no-untyped-call]
            self._id = stream_id
        return stream


def top_saved_tensor_hooks() -> object:
    """The innermost ``saved_tensors_hooks`` pair in force now (``None`` when there is none).

    Non-reentrant checkpointing pushes its own pair around the region it checkpoints, so a
    module that runs under a pair other than the one its pass started with is checkpointed.
    """
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


#: The base class of batch and instance norms: those whose ``training`` and ``track_running_stats``
#: are set update running statistics when called.
NORM_WITH_STATISTICS: type[nn.Module] = nn.modules.batchnorm._NormBase


#: The id of the graph task (backward) running on this thread, ``-1`` outside one (called once
#: per unpacked save of a lean checkpoint: the C function itself, no Python frame around it).
current_graph_task: Callable[[], int] = torch._C._current_graph_task_id


#: Whether FX symbolic tracing runs now, or compilation traces with FX (the flag alone, where
#: this PyTorch has it: ``torch.compiler.is_compiling`` is asked apart); ``is_fx_tracing``
#: itself warns at every call.
fx_tracing: Callable[[], bool] = getattr(
    torch.fx._symbolic_trace,
    "_get_is_fx_tracing",
    getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", torch.fx._symbolic_trace.is_fx_tracing),
)

#: How many torch function modes (a device context is one) and dispatch modes are in force.
function_mode_depth: Callable[[], int] = torch._C._len_torch_function_stack
dispatch_mode_depth: Callable[[], int] = torch._C._len_torch_dispatch_stack

#: ``saved_tensors_hooks``' own calls, without its context-manager object: push a
#: ``(pack, unpack)`` pair, pop the innermost, read the innermost (called with ``False``;
#: ``None`` when none is in force).
push_saved_tensor_hooks: Callable[[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]], None] = (
    torch._C._autograd._push_saved_tensors_default_hooks
)
pop_saved_tensor_hooks: Callable[[], None] = torch._C._autograd._pop_saved_tensors_default_hooks
innermost_saved_tensor_hooks: Callable[[bool], tuple[Callable[..., Any], Callable[..., Any]] | None] = (
    torch._C._autograd._top_saved_tensors_default_hooks
)

#: What ``torch.enable_grad`` and ``torch.no_grad`` set, without their context-manager objects.
set_grad_mode: Callable[[bool], None] = torch._C._set_grad_enabled


def modes_active() -> bool:
    """Whether a torch function mode (a device context) or dispatch mode is in force."""
    return bool(function_mode_depth() or dispatch_mode_depth())


def inside_checkpoint_hooks() -> bool:
    """Whether the innermost saved-tensor hooks are ``torch.utils.checkpoint``'s own (its
    forward or recomputation of a region around this call)."""
    hooks = innermost_saved_tensor_hooks(False)
    return hooks is not None and bool(getattr(hooks[0], "_checkpoint_internal", False))


def tracks_running_statistics(module: nn.Module) -> bool:
    """A batch or instance norm that updates running statistics when called now."""
    return isinstance(module, NORM_WITH_STATISTICS) and module.training and bool(module.track_running_stats)


#: The module's own buffers, by name: the dict ``module.<name>`` reads them from (a C call). Writing
#: a registered name there replaces the buffer as ``setattr`` does, without ``nn.Module``'s
#: ``__setattr__`` (its checks and the global buffer-registration hooks, a few µs a buffer).
buffers_of: Callable[[nn.Module], dict[str, torch.Tensor | None]] = attrgetter("_buffers")


def submodules_of(module: nn.Module) -> dict[str, nn.Module | None]:
    """The module's direct submodules, by name (``None`` where one is registered as ``None``):
    the dict ``named_children`` walks, read without building names or a memo set.

    Example:
        >>> list(submodules_of(nn.Sequential(nn.ReLU(), nn.Tanh())))
        ['0', '1']
    """
    return module._modules


_submodule_dicts = attrgetter("_modules")


def children_ids(modules: list[nn.Module]) -> list[int]:
    """The ids of the direct submodules of each of ``modules`` (``None`` where one is registered
    as ``None``), in order: what tells whether a module tree changed, in a few C calls however
    large the tree.

    Example:
        >>> relu, tanh = nn.ReLU(), nn.Tanh()
        >>> children_ids([nn.Sequential(relu, tanh), relu]) == [id(relu), id(tanh)]
        True
    """
    return list(map(id, chain.from_iterable(map(dict.values, map(_submodule_dicts, modules)))))


def copy_each(destinations: list[torch.Tensor], sources: list[torch.Tensor], non_blocking: bool) -> None:
    """``destinations[i].copy_(sources[i])`` for every ``i``, in one call (what the optimizers'
    ``foreach`` paths use): one dispatch from Python for a group of copies, not one per tensor
    (a group of one takes ``copy_`` itself, the cheaper call for a single pair).

    Example:
        >>> destinations = [torch.empty(2), torch.empty(3, dtype=torch.int64)]
        >>> copy_each(destinations, [torch.ones(2), torch.arange(3)], non_blocking=False)
        >>> destinations[1].tolist()
        [0, 1, 2]
    """
    if len(destinations) == 1:
        destinations[0].copy_(sources[0], non_blocking=non_blocking)
    else:
        torch._foreach_copy_(destinations, sources, non_blocking=non_blocking)


def empty_host_cache() -> None:
    """Give the idle pinned blocks of PyTorch's host caching allocator back to the system.

    ``torch.accelerator.empty_host_cache`` where PyTorch has it (2.14 does); before it, the
    binding that function wraps for CUDA (``torch._C._host_emptyCache``; PyTorch 2.11 has only
    that one). A no-op where the allocator has not been used.

    Example:
        >>> empty_host_cache()
    """
    accelerator = getattr(torch, "accelerator", None)
    release = getattr(accelerator, "empty_host_cache", None) or torch._C._host_emptyCache
    release()
