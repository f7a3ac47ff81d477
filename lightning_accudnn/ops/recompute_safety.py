"""Whether running a segment's forward again in backward gives autograd what its call gave.

A recomputation replays the segment's forward from its arguments as they were at the call
(:class:`~lightning_accudnn.ops.segment_inputs.SegmentInputs`), under the RNG and autocast
state of the call, with training BatchNorms updating scratch statistics. What it cannot
replay is state that the call itself changed or that changes between the call and backward:

* module state: an attribute of a module in the segment set or grown by the call (a cache,
  a counter, a position), or a buffer other than BatchNorm's running statistics written;
* argument state: an object passed in (a key/value cache) changed by the call, or a tensor
  argument written in place by the call or after it;
* outputs written in place after the call.

:class:`CallAudit` watches one call of a candidate segment in a profiling pass and says why
the segment is unsafe, or nothing. The checks cost a walk over the segment's modules and
arguments per call, in profiling passes only.
"""

from __future__ import annotations

import enum
import weakref
from typing import Any

import torch
from torch import nn

from lightning_accudnn.ops._torch_internals import tracks_running_statistics
from lightning_accudnn.ops.segment_inputs import SegmentInputs

__all__ = ["BATCH_NORM_STATISTICS", "CallAudit"]

# Module attributes that are not state a forward could change: the registries nn.Module
# keeps (parameters, buffers and submodules are compared by their own rules) and its hooks.
_MODULE_REGISTRIES = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})
#: The buffers a training BatchNorm updates in forward (a recomputation updates scratch copies).
BATCH_NORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
# How deep a call's arguments and its modules' attributes are walked: far enough to see a
# key/value cache passed as an argument grow (the keyword arguments, the cache, its list of
# layers, a layer, its tensors). State changed after the call is compared one level deep (a
# module's own attributes, and which objects they are): objects shared beyond the segment,
# such as a configuration the loss writes to, are not the segment's state.
_DEPTH = 8
_PLAIN = (bool, int, str, bytes, complex, torch.dtype, torch.device, enum.Enum, type(None))


class CallAudit:
    """One call of a candidate segment, watched from its start to the end of the forward pass.

    Make it when the call starts, call :meth:`after_call` with its output when it returns and
    :meth:`after_forward` when the forward pass is over; each returns why a recomputation of
    the segment would differ from the call, or ``None``.

    Example:
        >>> class Counting(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.linear, self.calls = nn.Linear(2, 2), 0
        ...     def forward(self, x):
        ...         self.calls += 1
        ...         return self.linear(x)
        >>> module, x = Counting(), torch.randn(1, 2)
        >>> audit = CallAudit(module, (x,), {})
        >>> audit.after_call(module(x))
        'calling it changes Counting.calls'
        >>> plain = nn.Linear(2, 2)
        >>> audit = CallAudit(plain, (x,), {})
        >>> audit.after_call(plain(x)) is None, audit.after_forward() is None
        (True, True)
    """

    __slots__ = (
        "module",
        "inputs",
        "_tensors",
        "_modules_before",
        "_own_state_after",
        "_arguments_before",
        "_outputs",
    )

    def __init__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.module = module
        self.inputs, self._tensors = SegmentInputs.record(args, kwargs)  # the tensors until it returns
        self._modules_before = _module_state(module, _DEPTH)
        self._own_state_after: dict[str, object] = {}
        self._arguments_before = _argument_state(args, kwargs)
        self._outputs: list[tuple[weakref.ref[torch.Tensor], int]] = []

    @property
    def call_tensors(self) -> tuple[torch.Tensor, ...]:
        """The call's distinct tensor arguments, until :meth:`after_call` (then none)."""
        return self._tensors

    def after_call(self, output: Any) -> str | None:
        """Why the call just ended changed what a replay would see, or ``None``."""
        changed = _changed_module(self._modules_before, _module_state(self.module, _DEPTH))
        if changed is not None:
            return f"calling it changes {changed}"
        (args, kwargs), self._tensors = self.inputs.rebuild(self._tensors), ()
        changed = _changed_module(self._arguments_before, _argument_state(args, kwargs))
        if changed is not None:
            return (
                f"calling it changes its {changed} (a tensor written in place, or an object such as a "
                "cache or a counter updated; a key/value cache in training: pass use_cache=False)"
            )
        self._outputs = [(weakref.ref(tensor), tensor._version) for tensor in _tensors_in(output)]
        self._own_state_after = _module_state(self.module, 1)
        return None

    def tensors_written(self) -> str | None:
        """Why a replay would differ because an argument or an output of the call, still alive,
        was written in place since, or ``None``. Cheap: the probe asks at every module call
        of the pass, while what the call took and gave is likely still referenced."""
        changed_input = self.inputs.changed_since_call()
        if changed_input is not None:
            return changed_input
        for index, (reference, version) in enumerate(self._outputs):
            tensor = reference()
            if tensor is not None and tensor._version != version:
                return f"its output {index} is written in place after the call"
        return None

    def after_forward(self) -> str | None:
        """Why what happened after the call (to the end of the forward pass) makes a replay
        differ, or ``None``: its modules' own state or a still-alive argument or output changed."""
        changed = _changed_module(self._own_state_after, _module_state(self.module, 1))
        if changed is not None:
            return f"{changed} changes after the call"
        return self.tensors_written()


def _tensors_in(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [item for item in output if isinstance(item, torch.Tensor)]
    if isinstance(output, dict):
        return [item for item in output.values() if isinstance(item, torch.Tensor)]
    return []


def _module_state(module: nn.Module, depth: int) -> dict[str, object]:
    """Per module of ``module``'s tree, qualified by its class and name: its attributes'
    fingerprints, ``depth`` levels deep, and its buffers' identities and versions (BatchNorm's
    running statistics excepted: a recomputation updates scratch copies of them)."""
    state: dict[str, object] = {}
    for name, inner in module.named_modules():
        label = f"{type(module).__name__}{'.' + name if name else ''}"
        skip = BATCH_NORM_STATISTICS if tracks_running_statistics(inner) else ()
        for key, value in vars(inner).items():
            if key in _MODULE_REGISTRIES or "hooks" in key or key == "forward":
                continue
            state[f"{label}.{key}"] = _fingerprint(value, depth, set())
        for key, buffer in inner._buffers.items():
            if key not in skip and buffer is not None:
                state[f"{label}.{key}"] = (id(buffer), buffer._version)
    return state


def _argument_state(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, object]:
    """Per argument, labelled for a message, its fingerprint."""
    state: dict[str, object] = {
        f"argument {index} ({type(value).__name__})": _fingerprint(value, _DEPTH, set())
        for index, value in enumerate(args)
    }
    for key, value in kwargs.items():
        state[f"argument {key!r} ({type(value).__name__})"] = _fingerprint(value, _DEPTH, set())
    return state


def _changed_module(before: dict[str, object], after: dict[str, object]) -> str | None:
    for key in before.keys() | after.keys():
        if before.get(key, _MISSING) != after.get(key, _MISSING):
            return key
    return None


_MISSING = object()


def _fingerprint(value: object, depth: int, seen: set[int]) -> object:
    """A comparable picture of ``value``'s state: tensors by identity and version, plain values
    by value, containers and objects walked ``depth`` levels deep (modules by identity: their
    own state is compared module by module)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    if isinstance(value, float):
        return "nan" if value != value else value
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, nn.Module) or depth == 0 or id(value) in seen:
        return ("object", id(value))
    seen.add(id(value))
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_fingerprint(item, depth - 1, seen) for item in value))
    if isinstance(value, dict):
        return (
            type(value),
            tuple(
                (key if isinstance(key, (str, int)) else id(key), _fingerprint(item, depth - 1, seen))
                for key, item in value.items()
            ),
        )
    if isinstance(value, (set, frozenset)):
        return (type(value), len(value))
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict) and not callable(value):
        return ("object", id(value), _fingerprint(attributes, depth - 1, seen))
    return ("object", id(value))
