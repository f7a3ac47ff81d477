"""Observe one training step without memory: what it saves and which kernels it runs.

The observation only; the time model that turns a :class:`~.roofline.StepTrace` into a
:class:`~lightning_accudnn.profile.StepProfile` for a GPU is :mod:`.roofline`.

:func:`trace_step` builds the model and a batch of zeros under
:class:`~torch._subclasses.fake_tensor.FakeTensorMode` (tensors with shapes, dtypes and
storages but no data) and runs one forward and backward (and, with a working-memory meter,
a second forward whose saves are dropped: what a recomputed segment's forward holds,
:mod:`.saveless_forward`). Three observers watch the step:

* ``saved_tensors_hooks`` collect what autograd saves for backward, attributed to the layer
  running now (the ``tracker``, normally :class:`lightning_accudnn.ops.layers.LayerTracker`,
  which names layer invocations exactly as the offload engine does). Parameters, buffers and
  views of them are skipped and each storage counts once, by storage identity, as the engine
  filters them. A storage saved again by a later layer is listed under the last such layer
  (:attr:`.LayerTrace.resaved`, :mod:`.resaves`), as the engine lists re-saves, so the profile says
  ``resaves_listed``. The bytes of float32 storages are counted apart
  (:attr:`.LayerTrace.float32_bytes`): what a 16-bit step still saves in float32.
* a dispatch mode records every kernel: the storages it creates, and when each is freed
  (for a target ``gpu``, as CUDA's caching allocator counts them, with the cuBLAS workspaces:
  :mod:`.cuda_allocations`; :mod:`.working_memory`: what the step holds besides its saves,
  :attr:`StepTrace.working_bytes`; beside the saves on the engine's ledger, which the hooks
  follow until autograd reads them, what it holds beyond each layer's levels:
  :mod:`.traced_ledger`, :attr:`.LayerTrace.forward_working_bytes`), FLOPs (from
  :mod:`torch.utils.flop_counter`'s formulas, plus the CPU flash attention kernels) and bytes
  moved (tensor bytes read and written).
  Forward kernels belong to the running layer; backward kernels to the layer whose forward
  created the autograd node that runs them.
* a function mode maps each autograd node to the layer that created it and runs the kernels a
  CUDA GPU would where the CPU's save other tensors: ``F.dropout`` becomes
  ``torch.native_dropout`` (CUDA's fused dropout saves a ``bool`` mask; the CPU kernel a mask
  in the activation's dtype), and, given the target ``gpu``,
  ``F.scaled_dot_product_attention`` becomes the cuDNN, flash, memory-efficient or math kernel
  that GPU runs for the call (:mod:`.attention`): the fused kernels save the
  output and log-sum-exp (and the RNG seed and offset with dropout), not the ``s x s``
  attention matrix of the CPU's math path; under mixed precision, the ops CUDA autocast runs
  in float32 and the CPU's in 16 bits (``pow``, ``exp``, ``layer_norm``, ``softmax``...) get
  float32 inputs, and those only CUDA runs in 16 bits (``einsum``...) 16-bit ones
  (:mod:`.cuda_autocast`). :attr:`StepTrace.kernels` lists what was assumed.

The trace runs on CPU fake tensors (the autograd engine cannot run backward on fake CUDA
tensors without a GPU). What departs from a real CUDA step:

* ``--dtype bf16``/``fp16`` is *mixed precision* (Lightning's ``"bf16-mixed"``): parameters
  stay fp32 and ops run under ``torch.autocast``. The CPU autocast policy is used; it casts
  the same ops as the CUDA one for convolutions, linear layers, matmuls and norms (checked on
  ResNet and ``nn.TransformerEncoderLayer``); batch-norm statistics (a few bytes per channel)
  differ in dtype.
* without a target ``gpu``, ``scaled_dot_product_attention`` runs PyTorch's CPU kernels:
  without dropout the CPU flash kernel, which saves the output and log-sum-exp as GPU flash
  attention does; with dropout (or a mask the flash kernel refuses) the math path, which
  saves the attention matrix. Causal attention FLOPs count the full square (as
  :mod:`torch.utils.flop_counter` does).
* without a target ``gpu`` the CPU autocast policy alone decides the dtypes: ops the CUDA
  policy runs in fp32 and the CPU one in 16 bits (``layer_norm``, ``softmax``, ``pow`` of a
  16-bit input) save 16-bit tensors. Torch functions called inside another torch function
  (the internals of ``F.multi_head_attention_forward``) are not rewritten.
* the attention and dropout inside ``F.multi_head_attention_forward``
  (``nn.MultiheadAttention``) run the CPU's kernels (the math path and a float mask with
  dropout), as does dropout not called through ``F.dropout``; :attr:`StepTrace.kernels`
  lists each such call under ``multi_head_attention_forward``.
* times come from a roofline per kernel (:meth:`.roofline.StepTrace.to_profile`), with no
  launch overhead and no overlap between kernels.
* cuDNN's workspaces (convolutions) and the caching allocator's blocks handed out whole (a
  cached block up to 1 MiB larger than asked) are not counted.

Example:
    >>> import torch
    >>> from lightning_accudnn.ops.layers import LayerTracker
    >>> from lightning_accudnn.profiling.gpus import get_gpu
    >>> def build():
    ...     return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU())
    >>> trace = trace_step(build, input_shape=(1024, 512), tracker=LayerTracker())
    >>> [(layer.name, layer.saved_bytes) for layer in trace.layers]
    [('0', 2097152), ('1', 2097152), ('(root)', 0)]
    >>> profile = trace.to_profile(get_gpu("h100"), optimizer="adam")
    >>> profile.static_bytes == 4 * (512 * 512 + 512) * 4
    True
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import (
    FakeTensorMode,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lightning_accudnn.profile import ROOT_LAYER, SELECTIVE_KEPT_OPS, SegmentProfile
from lightning_accudnn.profiling.attention import attention_kernel, run_attention
from lightning_accudnn.profiling.cuda_allocations import CUDA_BLOCK_BYTES, blas_workspace_bytes, runs_blas
from lightning_accudnn.profiling.cuda_autocast import cuda_autocast_args
from lightning_accudnn.profiling.fake_model import build_fake, cast_floating
from lightning_accudnn.profiling.gpus import GpuSpec
from lightning_accudnn.profiling.kernels import FLOP_FORMULAS, FREE_OPS, rate_class, tensor_bytes, tensors_in
from lightning_accudnn.profiling.losses import LOSSES, cross_entropy_loss, step_loss
from lightning_accudnn.profiling.resaves import ResaveLog
from lightning_accudnn.profiling.roofline import LayerTrace, OpCost, StepTrace
from lightning_accudnn.profiling.saveless_forward import SavelessForward
from lightning_accudnn.profiling.traced_ledger import MeterFactory, TracedLedger
from lightning_accudnn.profiling.working_memory import StorageLog
from lightning_accudnn.tensor_layout import holds_storage_whole

__all__ = [
    "DTYPES",
    "LOSSES",
    "LayerTrace",
    "OpCost",
    "StepTrace",
    "Tracker",
    "cross_entropy_loss",
    "precision",
    "step_loss",
    "trace_step",
]

#: The precisions a step is traced in: fp32; ``"bf16"``/``"fp16"``, mixed (autocast, parameters
#: fp32, as Lightning's ``"bf16-mixed"``); ``"bf16-true"``/``"fp16-true"``, the model and its
#: floating-point inputs cast to that dtype with no autocast (Lightning's ``"bf16-true"``).
DTYPES = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "bf16-true": torch.bfloat16,
    "fp16-true": torch.float16,
}


@runtime_checkable
class Tracker(Protocol):
    """What :func:`trace_step` needs from a layer tracker (``ops.layers.LayerTracker`` fits).

    Example:
        >>> from lightning_accudnn.ops.layers import LayerTracker
        >>> isinstance(LayerTracker(), Tracker)
        True
    """

    @property
    def current(self) -> str: ...

    def saving_layer(self) -> str: ...

    def attached(self, model: nn.Module) -> contextlib.AbstractContextManager[object]: ...


@dataclass
class _Recorder:
    """Shared state of the observers during one traced step."""

    tracker: Tracker
    capability: tuple[int, int] | None = None
    min_key_bytes: int = 0
    backward: bool = False
    node_layer: dict[object, str] = field(default_factory=dict)
    first_seen: dict[str, int] = field(default_factory=dict)  # layer -> the event it first ran an op or saved
    first_saved: dict[str, int] = field(default_factory=dict)  # layer -> the event of its first own save
    events: int = 0  # ops run and tensors saved so far
    saved: dict[str, list[int]] = field(default_factory=dict)
    float32_saved: Counter[str] = field(default_factory=Counter)  # per layer, its float32 storages' bytes
    flops: dict[str, list[int]] = field(default_factory=dict)
    ops: list[OpCost] = field(default_factory=list)
    param_storages: set[int] = field(default_factory=set)
    seen_storages: dict[int, int] = field(default_factory=dict)  # storage saved -> its bytes
    first_layer: dict[int, str] = field(default_factory=dict)  # storage -> the layer that saved it first
    saving: dict[str, None] = field(default_factory=dict)  # layers in order of their first own save
    resaves: ResaveLog = field(default_factory=ResaveLog)  # storages saved again, by key
    read_in_forward: set[int] = field(default_factory=set)  # storages unpacked during the forward
    step_held: set[int] = field(default_factory=set)  # storages the step holds throughout (the batch)
    saves: int = 0  # tensors saved so far, again or not
    last_saved: dict[int, int] = field(default_factory=dict)  # storage -> ``saves`` at its latest save
    held_saved: dict[str, list[int]] = field(default_factory=dict)  # per layer, those it saved first
    kernels: Counter[tuple[str, str]] = field(default_factory=Counter)
    blas_passes: set[bool] = field(default_factory=set)  # the passes (backward or not) that ran cuBLAS ops
    # Every storage the step's kernels create, and each storage's key (a serial number: unique
    # for the whole step, where an address may be reused once its storage is freed).
    storages: StorageLog = field(default_factory=StorageLog)
    selective: _Selective = field(init=False)
    ledger: TracedLedger = field(init=False)  # the saves on the engine's ledger, in the log's order

    def __post_init__(self) -> None:
        self.selective = _Selective(self.storages)
        self.ledger = TracedLedger(self.storages)

    def key(self, tensor: torch.Tensor) -> int | None:
        """The key of ``tensor``'s storage (``None``: it has no single storage)."""
        return self.storages.key(tensor)

    def _touch(self, layer: str) -> None:
        self.events += 1
        if layer not in self.first_seen:
            self.first_seen[layer] = self.events
            self.saved[layer] = []
            self.flops[layer] = [0, 0]

    def layer_order(self) -> list[str]:
        """The layers in the engine's order: each at its first own save (the step's own code,
        which runs ops before the first module but saves for its loss at the end, comes where
        its saves do, so that the planner brings them back first in backward), a layer that saves
        nothing where it first ran an op."""
        return sorted(self.first_seen, key=lambda layer: self.first_saved.get(layer, self.first_seen[layer]))

    # -- saved_tensors_hooks ------------------------------------------------------------
    def pack(self, tensor: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, int]:
        key = self.key(tensor)
        if key is not None and key in self.param_storages:
            return tensor
        layer = self.tracker.saving_layer()
        self.saves += 1
        if key is not None:
            self.last_saved[key] = self.saves
        if key is not None and key in self.seen_storages:
            # Saved again: backward needs it from the backward of this layer on (or, if this
            # layer saves nothing of its own, of the next that does), as the engine counts it.
            self.resaves.note(key, layer, self.saving)
            return tensor, self.ledger.saved(key, 0, layer, resaved=True)
        self._touch(layer)
        self.saving.setdefault(layer, None)
        self.first_saved.setdefault(layer, self.events)
        if key is None:
            size = tensor_bytes(tensor)
        else:
            size = tensor.untyped_storage().nbytes()
            self.seen_storages[key] = size
            self.first_layer[key] = layer
            if not self.backward:
                self.selective.saved(key, size)
        self.saved[layer].append(size)
        if key is not None and key in self.step_held:  # kept on the device: a swap frees nothing
            self.held_saved.setdefault(layer, []).append(size)
        if tensor.dtype == torch.float32:
            self.float32_saved[layer] += size
        self.storages.held(tensor)  # a save the step did not create (the batch) is held from now
        return tensor, self.ledger.saved(key, size, layer, resaved=False)

    def unpack(self, packed: torch.Tensor | tuple[torch.Tensor, int]) -> torch.Tensor:
        tensor, handle = packed if isinstance(packed, tuple) else (packed, None)
        if not self.backward:  # a backward inside the forward: needed from the start
            key = self.key(tensor)
            if key is not None:
                self.read_in_forward.add(key)
        elif handle is not None:
            self.ledger.unpacked(handle)
        return tensor

    def resaved(self) -> tuple[dict[str, list[tuple[str, int]]], dict[str, list[tuple[str, int]]]]:
        """Per layer, its storages saved again (:attr:`.LayerTrace.resaved`) and, of those, the
        ones saved again last by a layer that saves nothing of its own (``resaved_modules``)."""
        sizes = {key: self.seen_storages[key] for key in self.resaves.resaved_from}
        return self.resaves.listed(
            self.first_layer, sizes, self.saving, self.read_in_forward | self.step_held
        )

    # -- kernels ------------------------------------------------------------------------
    def record_op(
        self, func: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object], out: object
    ) -> None:
        if not self.backward:
            self.selective.writes(func, args, kwargs)
        if func in FREE_OPS or func.is_view:
            return
        if runs_blas(func):
            self.blas_passes.add(self.backward)
        if self.backward:
            node = torch._C._current_autograd_node()
            layer = self.node_layer.get(node, ROOT_LAYER) if node is not None else ROOT_LAYER
        else:
            layer = self.tracker.current
        self._touch(layer)
        flat_args = tensors_in((args, kwargs))
        flat_out = tensors_in(out)
        moved = sum(tensor_bytes(t) for t in flat_args + flat_out)
        flops = 0
        formula = FLOP_FORMULAS.get(func._overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
        self.flops[layer][int(self.backward)] += flops
        kept = not self.backward and func._overloadpacket.__name__ in SELECTIVE_KEPT_OPS
        if kept:
            self.selective.kept(flat_out)
        self.ops.append(OpCost(layer, self.backward, flops, moved, rate_class(func, flat_args), kept=kept))

    # -- autograd nodes -----------------------------------------------------------------
    def map_nodes(self, out: object) -> None:
        """Give every autograd node not seen yet, reachable from ``out``, to the running layer."""
        layer = self.tracker.current
        stack: list[torch.autograd.graph.Node | None] = [
            t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None
        ]
        while stack:
            node = stack.pop()
            if node is None or node in self.node_layer:
                continue
            self.node_layer[node] = layer
            stack.extend(next_node for next_node, _ in node.next_functions)


@dataclass
class _Selective:
    """What recomputing each open segment selectively would keep and rebuild (forward only):
    the distinct storages its :data:`SELECTIVE_KEPT_OPS` write (less its inputs), those saved
    inside it that are neither kept nor inputs, and whether a kept output is written in place."""

    storages: StorageLog
    open: list[str] = field(default_factory=list)
    inputs: dict[str, set[int]] = field(default_factory=dict)
    kept_storages: dict[str, dict[int, int]] = field(default_factory=dict)
    rebuilt_storages: dict[str, dict[int, int]] = field(default_factory=dict)
    unsafe: set[str] = field(default_factory=set)

    def enter(self, name: str, inputs: set[int]) -> None:
        self.open.append(name)
        self.inputs[name] = inputs
        self.kept_storages.setdefault(name, {})
        self.rebuilt_storages.setdefault(name, {})

    def exit(self, name: str) -> None:
        if name in self.open:
            del self.open[self.open.index(name) :]

    def kept(self, outputs: list[torch.Tensor]) -> None:
        for value in outputs:
            key = self.storages.key(value)
            if key is None:
                continue
            for name in self.open:
                if key not in self.inputs[name]:
                    self.kept_storages[name][key] = value.untyped_storage().nbytes()

    def saved(self, key: int, nbytes: int) -> None:
        for name in self.open:
            if key not in self.inputs[name] and key not in self.kept_storages[name]:
                self.rebuilt_storages[name][key] = nbytes

    def writes(
        self, func: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        """A kept output written in place: its segments would replay on the written values."""
        for i, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            key = self.storages.key(value) if isinstance(value, torch.Tensor) else None
            if key is not None:
                self.unsafe.update(name for name, kept in self.kept_storages.items() if key in kept)

    def measured(self, name: str) -> tuple[int | None, int | None]:
        """``(kept bytes, rebuilt bytes)`` of segment ``name`` (``None`` for both if unsafe)."""
        if name in self.unsafe or name not in self.kept_storages:
            return None, None
        return sum(self.kept_storages[name].values()), sum(self.rebuilt_storages[name].values())


@dataclass
class _Segments:
    """Forward hooks on every container module: what :class:`SegmentProfile` needs."""

    calls: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, set[int]] = field(default_factory=dict)
    input_bytes: dict[str, int] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)
    outputs: dict[int, list[str]] = field(default_factory=dict)  # storage -> segments whose outputs it is
    sources: dict[str, dict[str, int]] = field(default_factory=dict)  # per segment: earlier segment -> bytes
    recorder: _Recorder | None = None
    op_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)  # forward ops of each call
    # per segment: its input storages (key -> bytes), None where a tensor argument does not hold
    # one whole (a save of the segment's inputs copies it whole), and the saves made when its
    # call returned
    whole_inputs: dict[str, dict[int, int] | None] = field(default_factory=dict)
    saves_at_return: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def attached(self, model: nn.Module) -> Iterator[None]:
        handles = []
        for name, module in model.named_modules():
            if name and any(True for _ in module.children()):
                handles.append(module.register_forward_pre_hook(partial(self.enter, name), with_kwargs=True))
                handles.append(module.register_forward_hook(partial(self.exit, name)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def enter(
        self, name: str, module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name not in self.input_bytes:
            values = (*args, *kwargs.values())
            storages = self._distinct_storages(values)
            self.inputs[name] = set(storages)
            self.whole_inputs[name] = self._whole_storages(values)
            for returned in self.saves_at_return:  # a segment called before that takes one too
                earlier = self.whole_inputs.get(returned)
                if earlier is not None and not earlier.keys().isdisjoint(storages):
                    self.whole_inputs[returned] = None
            self.input_bytes[name] = sum(storages.values())
            sources: dict[str, int] = {}
            for key, nbytes in storages.items():
                for source in self.outputs.get(key, ()):
                    sources[source] = sources.get(source, 0) + nbytes
            self.sources[name] = sources
            if self.recorder is not None:
                self.recorder.selective.enter(name, set(storages))
                self.op_ranges[name] = (len(self.recorder.ops), len(self.recorder.ops))

    def exit(self, name: str, module: nn.Module, args: object, output: object) -> None:
        inputs = self.inputs.pop(name, None)
        if inputs is not None:
            if self.recorder is not None:
                self.saves_at_return[name] = self.recorder.saves
                self.recorder.selective.exit(name)
                self.op_ranges[name] = (self.op_ranges[name][0], len(self.recorder.ops))
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            storages = self._distinct_storages(outputs)
            self.output_bytes[name] = sum(n for key, n in storages.items() if key not in inputs)
            for value in outputs:
                key = self._key(value) if isinstance(value, torch.Tensor) else None
                if key is not None:
                    known = self.outputs.setdefault(key, [])
                    if name not in known:
                        known.append(name)

    def _key(self, tensor: torch.Tensor) -> int | None:
        return self.recorder.key(tensor) if self.recorder is not None else None

    def _distinct_storages(self, values: tuple[object, ...] | list[object]) -> dict[int, int]:
        storages: dict[int, int] = {}
        for value in values:
            if isinstance(value, torch.Tensor):
                key = self._key(value)
                if key is None:
                    storages[id(value)] = tensor_bytes(value)
                else:
                    storages[key] = value.untyped_storage().nbytes()
        return storages

    def _whole_storages(self, values: tuple[object, ...]) -> dict[int, int] | None:
        """The storages (key -> bytes) of the tensors among ``values``, ``None`` where one does
        not hold its storage whole or has no single storage."""
        whole: dict[int, int] = {}
        for value in values:
            if isinstance(value, torch.Tensor):
                key = self._key(value)
                if key is None or not holds_storage_whole(value):
                    return None
                whole[key] = value.untyped_storage().nbytes()
        return whole

    def swappable_inputs(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Per segment, the sizes of its input storages the engine may swap when it recomputes it
        whole (:attr:`.SegmentProfile.swappable_input_bytes`, before ``min_swap_bytes``): those
        the step does not hold throughout nor a backward inside the forward reads. None where an
        input is not held whole by a tensor argument, was not saved when the call returned, was
        saved again after it, or is an input of a segment called later (the segment's swap would
        copy it too, uncounted)."""
        recorder = self.recorder
        if recorder is None:
            return ()
        unswappable = recorder.step_held | recorder.read_in_forward
        result = []
        for name, whole in self.whole_inputs.items():
            returned = self.saves_at_return.get(name)
            if whole is None or returned is None:
                continue
            if any(recorder.last_saved.get(key, returned + 1) > returned for key in whole):
                continue
            sizes = tuple(nbytes for key, nbytes in whole.items() if key not in unswappable)
            if sizes:
                result.append((name, sizes))
        return tuple(result)

    def segments(self) -> tuple[SegmentProfile, ...]:
        """Containers called once (a module called twice cannot be wrapped as one segment)."""
        selective = self.recorder.selective if self.recorder is not None else _Selective(StorageLog())
        segments = []
        for name, nbytes in self.input_bytes.items():
            if self.calls[name] != 1:
                continue
            kept, rebuilt = selective.measured(name)
            segments.append(
                SegmentProfile(
                    name,
                    nbytes,
                    self.output_bytes.get(name, 0),
                    tuple(self.sources.get(name, {}).items()),
                    selective_kept_bytes=kept,
                    selective_recomputed_bytes=rebuilt,
                )
            )
        return tuple(segments)


class _KernelMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.recorder = recorder

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: object,
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.recorder.storages.created(tensors_in(out))
        self.recorder.record_op(func, args, kwargs, out)
        return out


class _FunctionMode(TorchFunctionMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: object,
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        recorder = self.recorder
        # In backward, the calls this mode sees are Python's: a checkpoint inside the model running
        # its forward again, which must be rewritten as its forward was (and counted there only).
        if recorder.capability is not None and torch.is_autocast_enabled("cpu"):
            dtype = torch.get_autocast_dtype("cpu")
            args, kwargs, policy = cuda_autocast_args(func, args, kwargs, dtype)
            if policy is not None:
                self._assumed("autocast", f"CUDA policy: {policy}")
        call: Callable[..., object] = func
        if func is F.dropout:
            call = _cuda_like_dropout
            self._assumed("dropout", "fused (bool mask)")
        elif func is F.scaled_dot_product_attention and self.recorder.capability is not None:
            call = partial(_target_attention, self.recorder)
        elif func is F.multi_head_attention_forward and self.recorder.capability is not None:
            # Its attention and dropout run inside it, out of this mode's reach: the CPU's kernels.
            self._assumed("multi_head_attention_forward", "CPU kernels (not rewritten)")
        out = call(*args, **kwargs)
        if not self.recorder.backward:
            self.recorder.map_nodes(out)
        return out

    def _assumed(self, op: str, kernel: str) -> None:
        """Count a kernel the trace assumed for ``op``, in the forward (once per call there)."""
        if not self.recorder.backward:
            self.recorder.kernels[op, kernel] += 1


def _backward_under_modes(loss: torch.Tensor) -> None:
    """``loss.backward()`` with the trace's function mode still in force. ``Tensor.backward`` is a
    torch function, which a mode handles with itself taken off the stack, so the whole backward
    would run without it; a checkpoint inside the model (``torch.utils.checkpoint``, Hugging Face's
    gradient checkpointing) then ran its forward again with the CPU's dropout and attention and
    CPU autocast's casts, not the target's of the first forward, and failed its check of the
    tensors saved. Autograd's engine is called directly instead, as ``torch.autograd.backward``
    calls it."""
    torch.autograd.graph._engine_run_backward(
        (loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True, accumulate_grad=True
    )


def _cuda_like_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    # CUDA's fused dropout (native_dropout) saves a bool mask; the CPU path saves a mask
    # in the input's dtype. Use the CUDA one so mask bytes match the GPU being planned.
    if training and 0 < p < 1 and not inplace:
        return torch.native_dropout(input, p, True)[0]
    return F.dropout(input, p, training, inplace)


def _target_attention(
    recorder: _Recorder,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as the target GPU runs it (:mod:`.attention`)."""
    assert recorder.capability is not None
    if torch.is_autocast_enabled("cpu"):  # CUDA autocast runs attention in 16 bits
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
    kernel = attention_kernel(
        recorder.capability, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa
    )
    if not recorder.backward:  # a checkpoint's recomputation in backward runs it again
        recorder.kernels["scaled_dot_product_attention", kernel] += 1
    with torch.autocast("cpu", enabled=False):
        return run_attention(kernel, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


@contextlib.contextmanager
def precision(dtype: str, device_type: str = "cpu") -> Iterator[None]:
    """The step's precision on ``device_type``: autocast to the 16-bit dtype for mixed
    ``"bf16"``/``"fp16"`` (Lightning's ``"bf16-mixed"``), nothing for ``"fp32"`` and the
    ``-true`` precisions (the model itself is cast); an unknown ``dtype`` raises.

    Example:
        >>> with precision("bf16"):
        ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
        torch.bfloat16
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    if DTYPES[dtype] is None or dtype.endswith("-true"):
        yield
        return
    with torch.autocast(device_type, dtype=DTYPES[dtype]):
        yield


def trace_step(
    build: Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    *,
    tracker: Tracker,
    input_dtype: torch.dtype = torch.float32,
    dtype: str = "fp32",
    gpu: GpuSpec | None = None,
    loss: str = "mean",
    meter: MeterFactory | None = None,
    set_grads_to_none: bool = True,
) -> StepTrace:
    """Trace one training step of ``build()`` on a batch of shape ``input_shape``.

    ``build`` is called under fake-tensor mode, so the model's parameters take no memory
    (a model whose constructor loads real data, such as pretrained weights, cannot be
    built this way). A constructor whose initialisation depends on values (ViT's and
    ConvNeXt's ``trunc_normal_``) is run on the meta device instead and its parameters and
    buffers become fake afterwards; tensors it keeps outside parameters and buffers then
    stay on the meta device and the forward may fail.

    ``input_shape`` includes the batch dimension; the batch is zeros of ``input_dtype``
    (zeros are valid token ids for integer inputs). ``dtype`` is ``"fp32"``, mixed
    precision ``"bf16"``/``"fp16"`` (autocast; parameters stay fp32) or ``"bf16-true"``/
    ``"fp16-true"`` (the model and a floating-point batch cast to that dtype, no autocast).
    ``loss`` names the loss (:data:`LOSSES`): ``"mean"``, the mean of every floating-point
    output (:func:`step_loss`), or ``"cross-entropy"`` over the first
    (:func:`cross_entropy_loss`). ``tracker`` names layers (pass
    ``lightning_accudnn.ops.layers.LayerTracker()``; this package does not import ``ops``).
    ``gpu`` is the GPU planned for: attention runs as the kernel it would choose (see the
    module docstring); ``None`` keeps the CPU's attention kernels. ``meter`` makes the meter that
    charges the step's working memory to each layer's levels (pass
    ``lightning_accudnn.ops.working_memory.WorkingMemoryMeter``; :mod:`.traced_ledger`), and
    runs the second forward, whose saves are dropped (:attr:`~.roofline.StepTrace.saveless_forward_bytes`):
    without one the layers' working bytes are 0 and that forward does not run.

    The step drops the model's output once its loss is computed, as a training step that returns
    its loss does (autograd holds what it saved). ``set_grads_to_none``: the step starts with the
    parameters' gradients set to ``None`` (``zero_grad()``'s default, and Lightning's), so its
    backward makes each: a level before a gradient exists holds less than the model state counts
    (negative working memory). ``False`` (gradients zeroed in place, or accumulated over several
    batches): they are held all step.

    Example:
        >>> from lightning_accudnn.ops.layers import LayerTracker
        >>> def build():
        ...     return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        >>> trace = trace_step(build, (2, 3, 32, 32), tracker=LayerTracker())
        >>> [layer.name for layer in trace.layers]
        ['0', '1', '2', '(root)']
        >>> trace.forward_flops == 2 * (2 * 30 * 30) * 8 * 3 * 9
        True
    """
    with precision(dtype):  # validates dtype before any work
        pass
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}: one of {', '.join(LOSSES)}")
    loss_of = LOSSES[loss]
    fake_mode = FakeTensorMode()
    recorder = _Recorder(
        tracker=tracker,
        capability=None if gpu is None else gpu.compute_capability,
        storages=StorageLog(block_bytes=1 if gpu is None else CUDA_BLOCK_BYTES),
    )
    segments = _Segments(recorder=recorder)
    model = build_fake(build, fake_mode)
    with fake_mode:
        true_dtype = DTYPES[dtype] if dtype.endswith("-true") else None
        if true_dtype is not None:
            cast_floating(model, true_dtype)
            if input_dtype.is_floating_point:
                input_dtype = true_dtype
        model.train()
        params = list(model.parameters())
        buffers = list(model.buffers())
        for tensor in params + buffers:
            key = recorder.key(tensor)
            if key is not None:
                recorder.param_storages.add(key)
        batch = torch.zeros(input_shape, dtype=input_dtype)
        recorder.storages.held(batch)  # on the device before the step
        if (batch_key := recorder.key(batch)) is not None:  # and after it: the engine keeps its saves
            recorder.step_held.add(batch_key)
        # The cuBLAS workspaces of the forward's thread and of autograd's, made by the first step
        # and held from then on (left out below for a pass that multiplies no matrices).
        threads = (
            {}
            if gpu is None
            else {
                backward: torch.empty(blas_workspace_bytes(gpu.compute_capability, 1), dtype=torch.uint8)
                for backward in (False, True)
            }
        )
        for workspace in threads.values():
            recorder.storages.held(workspace)
        with (
            segments.attached(model),
            tracker.attached(model),
            _KernelMode(recorder),
            _FunctionMode(recorder),
        ):
            # The saves pass the recorder as the engine's hooks see them: in the forward and its
            # loss only (a reentrant checkpoint's recomputation in backward saves past them).
            with torch.autograd.graph.saved_tensors_hooks(recorder.pack, recorder.unpack), precision(dtype):
                total = loss_of(model(batch))  # the output dies here, as in a step returning its loss
            recorder.backward = True
            recorder.ledger.begin_backward()
            _backward_under_modes(total)
    grads = {
        key: p.grad.untyped_storage().nbytes()
        for p in params
        if p.grad is not None and (key := recorder.key(p.grad)) is not None
    }
    # Model state the step makes (the gradients, set to None before it: their bytes as the
    # planner counts them) or holds all step (left out of the log's count, as is the workspace of
    # a thread that multiplied no matrices).
    made = sum(grads.values()) if set_grads_to_none else 0
    left_out: set[int] = set() if set_grads_to_none else set(grads)
    for backward, workspace in threads.items():
        if backward not in recorder.blas_passes and (key := recorder.key(workspace)) is not None:
            left_out.add(key)
    working_bytes = recorder.storages.peak_bytes(left_out | set(grads) | set(recorder.seen_storages))
    names = recorder.layer_order()
    levels = (
        None
        if meter is None
        else recorder.ledger.working_memory(meter, left_out, names, made_state_bytes=made)
    )
    saveless = {} if meter is None else _saveless_forward(fake_mode, model, batch, recorder, names, dtype)
    trainable = sum(tensor_bytes(p) for p in params if p.requires_grad)
    resaved, modules = recorder.resaved()
    layers = tuple(
        LayerTrace(
            name,
            tuple(recorder.saved[name]),
            forward_flops=recorder.flops[name][0],
            backward_flops=recorder.flops[name][1],
            resaved=tuple(resaved.get(name, ())),
            resaved_modules=tuple(modules.get(name, ())),
            float32_bytes=recorder.float32_saved[name],
            held=tuple(recorder.held_saved.get(name, ())),
            forward_working_bytes=0 if levels is None else levels.forward_bytes.get(name, 0),
            backward_working_bytes=0 if levels is None else levels.backward_bytes.get(name, 0),
        )
        for name in names
    )
    return StepTrace(
        layers=layers,
        ops=tuple(recorder.ops),
        param_bytes=sum(tensor_bytes(p) for p in params),
        trainable_param_bytes=trainable,
        buffer_bytes=sum(tensor_bytes(b) for b in buffers),
        dtype=dtype,
        segments=segments.segments(),
        segment_ops=tuple((name, first, end) for name, (first, end) in segments.op_ranges.items()),
        segment_swappable_inputs=segments.swappable_inputs(),
        kernels=tuple((op, kernel, calls) for (op, kernel), calls in sorted(recorder.kernels.items())),
        resaves_listed=True,
        working_bytes=working_bytes,
        allocated_peak_bytes=recorder.storages.peak_bytes(left_out) - made,
        saveless_forward_bytes=tuple(saveless.items()),
    )


def _saveless_forward(
    fake_mode: FakeTensorMode,
    model: nn.Module,
    batch: torch.Tensor,
    recorder: _Recorder,
    names: list[str],
    dtype: str,
) -> dict[str, int]:
    """What the step's forward holds at each of its saving layers (``names``) with its saves
    dropped, its calls run as on the GPU traced for (:mod:`.saveless_forward`)."""
    tracker = recorder.tracker
    watch = SavelessForward(tracker, names, block_bytes=recorder.storages.block_bytes)
    again = _Recorder(tracker=tracker, capability=recorder.capability, storages=StorageLog())
    with fake_mode, tracker.attached(model), _FunctionMode(again), watch.watching(), precision(dtype):
        model(batch)
    return watch.held_bytes()
