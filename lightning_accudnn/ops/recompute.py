"""Recompute chosen segments: run a module's forward under non-reentrant checkpointing.

A recomputed segment saves only its inputs in forward (through the saved-tensor hooks in
force around it, so the offload engine keeps or swaps them like any saved tensor); what the
segment saves inside goes to the checkpoint and is rebuilt by running the forward again in
backward. :class:`SegmentRecomputer` installs a wrapper of each chosen module's ``forward``
once (no per-step module hooks) and removes it cleanly; :class:`SegmentProbe` measures, in a
profiling pass, which modules may be recomputed and their inputs' bytes.

A segment recomputed whole is checkpointed by :func:`~.lean_recompute.lean_checkpoint`
(``torch.utils.checkpoint``'s non-reentrant contract with a fraction of its Python per saved
tensor); a segment recomputed selectively (and every segment of a plan that has one), a
compiled block, and a call under a torch function or dispatch mode, compilation or FX tracing
use ``torch.utils.checkpoint`` itself.

Segments may nest (two-level checkpointing): a segment inside another that is recomputed is
checkpointed again while the outer one's forward runs again in backward, as it was in forward,
so that recomputation holds only the inner segments' inputs, and each inner segment is then
recomputed in its turn.

A compiled block (regional ``torch.compile``) is a segment as a whole: it is probed and
recomputed from its eager boundary (see :mod:`.compiled_blocks`), its compiled code run again
as it is, so recomputing it compiles nothing again; the modules inside it are never segments.

What recomputation keeps exact:

* random numbers: the forward's RNG states are replayed (dropout);
* BatchNorm running statistics are updated once per step: while a segment is recomputed,
  every training-mode BatchNorm in it updates scratch statistics (see
  :mod:`.recomputation_scope`), so the recomputed output, computed from batch statistics as in
  forward, is bitwise the same and the buffers are untouched;
* the segment module's own forward hooks run once (the wrapper calls the original
  ``forward``, which ``nn.Module.__call__`` reaches after the hooks). Hooks of modules
  *inside* the segment run again during recomputation (``is_recomputing()`` says when).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from lightning_accudnn.ops._torch_internals import (
    SELECTIVE_SAVES_THROUGH_HOOKS,
    STOP_RECOMPUTATION,
    StorageWeakReference,
    top_saved_tensor_hooks,
)
from lightning_accudnn.ops.compiled_blocks import (
    CallWrapHandle,
    compiled_in_place,
    modules_outside_compiled_code,
    wrap_compiled_call,
)
from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.ops.lean_recompute import lean_checkpoint, lean_possible
from lightning_accudnn.ops.recomputation_scope import RecomputationScope, is_recomputing
from lightning_accudnn.ops.recompute_safety import CallAudit
from lightning_accudnn.ops.segment_inputs import SegmentInputs
from lightning_accudnn.ops.selective import SelectiveRecorder, selective_contexts
from lightning_accudnn.ops.stash import StorageRecord
from lightning_accudnn.ops.timing import RecomputationTimer
from lightning_accudnn.profile import ExcludedSegment, SegmentProfile
from lightning_accudnn.tensor_layout import holds_storage_whole

__all__ = ["SegmentProbe", "SegmentRecomputer", "is_recomputing"]

#: The engine's records of a tensor's storage in the pass so far, and the pass's saves so far
#: (:meth:`~.pack.SaveRecords.records_of`).
RecordsOf = Callable[[torch.Tensor], tuple[list[StorageRecord], int]]


def _contexts(
    scope: RecomputationScope,
) -> tuple[contextlib.AbstractContextManager[None], RecomputationScope]:
    return contextlib.nullcontext(), scope


def _selective(
    scope: RecomputationScope,
) -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
    return selective_contexts(scope)


#: ``checkpoint``'s keywords that pass what selective checkpointing keeps through the hooks in
#: force (the engine's), where this PyTorch has it, and replay the whole segment: an output it
#: keeps is handed back (and its save unpacked) only when the replay reaches its op, and one no
#: backward reads (a projection added to the residual) lies after the last save a recomputation
#: that stops early rebuilds. Never unpacked, the engine would count it until the step ends,
#: though checkpointing lets it go once the segment's backward is done.
_THROUGH_HOOKS: dict[str, Any] = (
    {"respect_saved_tensors_hooks": True, "early_stop": False} if SELECTIVE_SAVES_THROUGH_HOOKS else {}
)


class SegmentRecomputer:
    """Wraps the ``forward`` of the named submodules so that they run under checkpointing.

    A block compiled in place (``block.compile()``) runs its ``forward`` inside its compiled
    code: its compiled call is wrapped instead, from outside (a ``torch.compile(block)``
    wrapper's ``forward`` is that call already), so the block is recomputed as a whole and
    compiled once.

    The wrappers are installed by :meth:`install` (again only when the model or the names
    change) and do nothing but call the original ``forward`` unless :attr:`enabled` is set
    and gradients are enabled. :meth:`remove` restores every module as it was.

    A segment named in ``selective`` is recomputed selectively: the outputs of matrix
    products, convolutions and attention kernels are kept (through the saved-tensor hooks
    in force, where this PyTorch can), the other ops run again (see :mod:`.selective`).

    Example:
        >>> model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 1))
        >>> recomputer = SegmentRecomputer()
        >>> recomputer.install(model, ["0"])
        >>> with recomputer.enabled_for_pass():
        ...     loss = model(torch.randn(2, 4)).sum()
        >>> loss.backward()
        >>> recomputer.installed, "forward" in vars(model[0])
        (('0',), True)
        >>> recomputer.remove(); "forward" in vars(model[0])
        False
        >>> recomputer.install(model, [], selective=["0"])
        >>> recomputer.installed, recomputer.selective
        (('0',), ('0',))
    """

    __slots__ = (
        "enabled",
        "failures",
        "last_recomputed",
        "timing",
        "_model",
        "_wrapped",
        "_scopes",
        "_selective",
    )

    def __init__(self) -> None:
        self.enabled = False
        self.failures: dict[str, str] = {}
        """Segments whose recomputation failed (a forward that raised, or inputs written in
        place since the call), with why, until the owner takes them."""
        self.last_recomputed: str | None = None
        """The segment recomputed last (what a ``CheckpointError`` raised right after its
        recomputation is about)."""
        self.timing: RecomputationTimer | None = None
        """Times each recomputation while set (a pass timed layer by layer)."""
        self._model: nn.Module | None = None
        # name -> (module, its own forward before, or the handle of its wrapped compiled call)
        self._wrapped: dict[str, tuple[nn.Module, object]] = {}
        self._scopes: list[RecomputationScope] = []  # one per installed segment
        self._selective: frozenset[str] = frozenset()

    @property
    def installed(self) -> tuple[str, ...]:
        return tuple(self._wrapped)

    @property
    def selective(self) -> tuple[str, ...]:
        """The installed segments recomputed selectively."""
        return tuple(sorted(self._selective))

    def install(self, model: nn.Module, names: Iterable[str], selective: Iterable[str] = ()) -> None:
        """Recompute exactly the submodules ``names`` of ``model`` as a whole and ``selective``
        selectively (none: remove every wrapper). A name in both is recomputed selectively."""
        chosen = frozenset(selective)
        wanted = tuple(sorted(set(names) | chosen))
        if model is self._model and wanted == self.installed and chosen == self._selective:
            return
        self.remove()
        self._model = model
        self._selective = chosen
        for name in wanted:
            module = model.get_submodule(name)
            scope = RecomputationScope(module)
            self._scopes.append(scope)
            options = _checkpoint_options(scope, selective=name in chosen)
            if compiled_in_place(module):
                run = partial(_run, self, name, None, options)
                self._wrapped[name] = (module, wrap_compiled_call(module, run))
                continue
            previous = vars(module).get("forward", _NOTHING)
            # Whole segments take the lean checkpoint; with a selective segment in the plan every
            # segment takes torch's, whose hooks a segment nested in a selective one must see.
            lean = None if chosen else scope
            module.forward = partial(_run, self, name, lean, options, module.forward)
            self._wrapped[name] = (module, previous)

    def remove(self) -> None:
        """Restore every wrapped module's ``forward``. Idempotent."""
        for module, previous in self._wrapped.values():
            if isinstance(previous, CallWrapHandle):
                previous.remove()
            elif previous is _NOTHING:
                vars(module).pop("forward", None)
            else:
                vars(module)["forward"] = previous
        self._wrapped.clear()
        self._scopes.clear()
        self._selective = frozenset()
        self._model = None
        self.enabled = False

    def scratch_bytes(self) -> int:
        """The scratch statistics the installed segments' recomputations keep on the device (see
        :func:`~.recomputation_scope.scratch_statistics_bytes`)."""
        return sum(scope.scratch_bytes for scope in self._scopes)

    @contextlib.contextmanager
    def enabled_for_pass(self) -> Iterator[None]:
        """Recompute inside the block (a forward pass run under a plan that recomputes)."""
        self.enabled = True
        try:
            yield
        finally:
            self.enabled = False


_NOTHING = object()
_grad_enabled = torch.is_grad_enabled


def _checkpoint_options(scope: RecomputationScope, *, selective: bool) -> dict[str, Any]:
    """``checkpoint``'s keywords for the segment of ``scope``, made once when it is installed."""
    if selective:
        return {
            "use_reentrant": False,
            "preserve_rng_state": True,
            "context_fn": partial(_selective, scope),
            **_THROUGH_HOOKS,
        }
    return {"use_reentrant": False, "preserve_rng_state": True, "context_fn": partial(_contexts, scope)}


def _run(
    recomputer: SegmentRecomputer,
    name: str,
    lean: RecomputationScope | None,
    options: dict[str, Any],
    forward: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    if not recomputer.enabled or not _grad_enabled():
        return forward(*args, **kwargs)
    inputs, tensors = SegmentInputs.record(args, kwargs)
    replay = _Replay(recomputer, name, forward, inputs, args, kwargs)
    if lean is not None and lean_possible():
        return lean_checkpoint(replay, tensors, lean)
    return checkpoint(replay, *tensors, **options)


class _Replay:
    """What checkpointing runs: the segment's call as it was made, then each recomputation from
    the arguments recorded at the call (new containers, the same tensor in the same places)."""

    __slots__ = ("recomputer", "name", "forward", "inputs", "call")

    def __init__(
        self,
        recomputer: SegmentRecomputer,
        name: str,
        forward: Callable[..., Any],
        inputs: SegmentInputs,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.recomputer, self.name, self.forward, self.inputs = recomputer, name, forward, inputs
        self.call: tuple[tuple[Any, ...], dict[str, Any]] | None = (args, kwargs)

    def __call__(self, *tensors: torch.Tensor) -> Any:
        call = self.call
        if call is not None:
            self.call = None  # the call's own objects are held no longer than it runs
            return self.forward(*call[0], **call[1])
        recomputer, inputs = self.recomputer, self.inputs
        recomputer.last_recomputed = self.name
        changed = inputs.changed_since_call()
        if changed is not None:
            raise self._failed(changed)
        args, kwargs = inputs.rebuild(tensors)
        enabled = recomputer.enabled
        recomputer.enabled = True  # segments inside this one are checkpointed again, as in forward
        timing = recomputer.timing
        start = timing.clock.mark() if timing is not None else None
        try:
            outputs = self.forward(*args, **kwargs)
        except STOP_RECOMPUTATION:  # control flow: every save needed is recomputed, the rest skipped
            if timing is not None:
                timing.record(self.name, start)
            raise
        except torch.OutOfMemoryError:  # memory, not safety
            raise
        except Exception as error:
            raise self._failed(f"its forward raised {type(error).__name__}: {error}") from error
        finally:
            recomputer.enabled = enabled
        if timing is not None:
            timing.record(self.name, start)
        return outputs

    def _failed(self, reason: str) -> RecomputationError:
        self.recomputer.failures[self.name] = reason
        return RecomputationError(self.name, reason)


class SegmentProbe:
    """Which submodules one forward pass could recompute, and their inputs' bytes.

    :meth:`attach` it inside the saved-tensor hooks of the pass (the engine's): a module is
    a segment when it has submodules or is a compiled block, is called once, runs under those
    hooks (not inside someone else's checkpointing) and has no submodule that does not, nor
    one that is also called outside it (a shared module, whose layers are all named under its
    first name: a recomputation would not free the saves of its call outside). A
    compiled block is observed at its eager boundary (an in-place compiled block through its
    wrapped call: a hook on it would be traced into its graph). Its ``input_bytes``
    are the distinct storages of its tensor arguments, its ``output_bytes`` those of its
    tensor outputs (top level, or in a tuple or list) that are not inputs, its
    ``input_sources`` the input bytes per earlier segment whose outputs (still alive) they are.

    Attached with the engine's :meth:`~.pack.SaveRecords.records_of`, it also finds each
    segment's ``swappable_input_bytes``: once the engine's forward is over
    (:meth:`settle_inputs`), the input storages whose records are all still swappable (not held
    by the model's code beyond the forward, not read by a backward inside it). None where an
    input is not held whole by a tensor argument, was not saved by the engine when the call
    returned, was saved again after it or is an input of a segment called later (recomputed,
    that one saves it again): the engine, swapping the segment's layer, would copy such an input
    too, and the plan would not count that copy, or bring it back for the later save.

    Example:
        >>> model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), nn.Linear(4, 1))
        >>> probe = SegmentProbe()
        >>> with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        ...     probe.attach(model)
        ...     _ = model(torch.randn(2, 4))
        >>> probe.detach(); probe.segments()
        (SegmentProfile(name='0', input_bytes=32, output_bytes=32),)
    """

    __slots__ = (
        "_handles",
        "_reference",
        "_calls",
        "_input_bytes",
        "_inputs",
        "_output_bytes",
        "_foreign",
        "_parents",
        "_outputs",
        "_sources",
        "_audits",
        "_unsafe",
        "_recorder",
        "_measured",
        "_saves_seen",
        "_not_selective",
        "_records_of",
        "_input_records",
        "_returned_inputs",
        "_swappable_inputs",
    )

    def __init__(self) -> None:
        self._handles: list[RemovableHandle | CallWrapHandle] = []
        self._reference: object = None
        self._calls: dict[str, int] = {}
        self._input_bytes: dict[str, int] = {}
        self._inputs: dict[str, set[int]] = {}  # storages of each segment's inputs, until it returns
        self._output_bytes: dict[str, int] = {}
        self._foreign: set[str] = set()
        self._parents: set[str] = set()
        # storage address -> (segments whose outputs it is, a weak reference to one such output)
        self._outputs: dict[int, tuple[list[str], weakref.ref[torch.Tensor]]] = {}
        self._sources: dict[str, dict[str, int]] = {}  # per segment: earlier segment -> input bytes
        self._audits: dict[str, CallAudit] = {}  # each candidate's call, watched to the forward's end
        self._unsafe: dict[str, str] = {}  # candidates not to recompute: why
        self._recorder: SelectiveRecorder | None = None  # while a pass measures selective recomputation
        # segment -> selective kept bytes, share of forward time recomputed, saves recomputed
        self._measured: dict[str, tuple[int, float, int]] = {}
        self._saves_seen: torch.autograd.graph.saved_tensors_hooks | None = None
        self._not_selective: dict[str, str] = {}  # measured, but a selective replay would not be exact
        self._records_of: RecordsOf | None = None
        # per segment, when its call returned: each whole input storage's bytes, the engine's
        # records of it and the pass's saves so far (until settle_inputs)
        self._input_records: dict[str, tuple[list[tuple[int, list[StorageRecord]]], int] | None] = {}
        # per segment returned: its input storages (address -> a weak reference: an address freed
        # may be another storage's later), until a later segment takes one of them too
        self._returned_inputs: dict[str, dict[int, StorageWeakReference]] = {}
        self._swappable_inputs: dict[str, tuple[int, int]] = {}  # segment -> (bytes, storages)

    def attach(
        self, model: nn.Module, *, selective: bool = False, records_of: RecordsOf | None = None
    ) -> None:
        """Hook every submodule of ``model`` for one pass (forgetting what a previous one saw).

        With ``selective``, also measure what recomputing each segment selectively would keep
        and cost (every op of the forward is seen and timed, and every saved tensor passes
        through the probe on its way to the hooks in force, until :meth:`finish_forward`; a
        model with compiled blocks is not measured). With ``records_of`` (the engine's
        :meth:`~.pack.SaveRecords.records_of`), also find the inputs the engine may swap.
        """
        self.detach()
        self._measured, self._not_selective = {}, {}
        self._records_of, self._input_records, self._swappable_inputs = records_of, {}, {}
        self._returned_inputs = {}
        hooks = top_saved_tensor_hooks()
        if (
            selective
            and isinstance(hooks, tuple)
            and not any(compiled for _, _, compiled in modules_outside_compiled_code(model))
        ):
            excluded = frozenset(
                tensor.untyped_storage().data_ptr() for tensor in (*model.parameters(), *model.buffers())
            )
            recorder = self._recorder = SelectiveRecorder(excluded)
            pack, unpack = hooks
            self._saves_seen = torch.autograd.graph.saved_tensors_hooks(
                partial(_seen, recorder, pack), unpack
            )
            self._saves_seen.__enter__()
            recorder.__enter__()  # type: ignore[no-untyped-call]
        self._reference = top_saved_tensor_hooks()
        self._calls, self._input_bytes, self._foreign, self._parents = {}, {}, set(), set()
        self._inputs, self._output_bytes, self._outputs, self._sources = {}, {}, {}, {}
        self._audits, self._unsafe = {}, {}
        for name, module, compiled in modules_outside_compiled_code(model):
            if not name:
                continue
            if compiled or any(True for _ in module.children()):
                self._parents.add(name)
            if compiled_in_place(module):
                self._handles.append(wrap_compiled_call(module, partial(self._observe, name, module)))
                continue
            if name in self._parents:
                self._handles.append(module.register_forward_hook(partial(self._exit, name)))
            self._handles.append(
                module.register_forward_pre_hook(partial(self._enter, name), with_kwargs=True)
            )

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stop_recording()

    def _stop_recording(self) -> None:
        recorder, self._recorder = self._recorder, None
        saves_seen, self._saves_seen = self._saves_seen, None
        if recorder is not None:
            recorder.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self._measured = {
                name: (nbytes, recorder.recompute_share(name), recorder.recomputed_bytes[name])
                for name, nbytes in recorder.kept_bytes.items()
                if name not in recorder.unsafe
            }
            self._not_selective = dict(recorder.unsafe)
        if saves_seen is not None:
            saves_seen.__exit__(None, None, None)

    def _observe(
        self, name: str, module: nn.Module, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """An in-place compiled block's call, between what its pre-hook and hook would see."""
        self._enter(name, module, args, kwargs)
        output = call(*args, **kwargs)
        self._exit(name, module, args, output)
        return output

    def _enter(self, name: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._calls[name] = self._calls.get(name, 0) + 1
        self._check_returned()
        if top_saved_tensor_hooks() != self._reference:
            self._foreign.add(name)
        parent = name.rpartition(".")[0]
        if parent and parent not in self._inputs:  # not inside its parent's first call
            self._called_outside(parent)
        if name in self._parents and name not in self._input_bytes:
            audit = self._audits[name] = CallAudit(module, args, kwargs)
            storages = _storages(audit.call_tensors)
            self._input_bytes[name] = sum(storages.values())
            self._inputs[name] = set(storages)
            self._taken_again(storages.keys())
            sources: dict[str, int] = {}
            for address, nbytes in storages.items():
                known = self._outputs.get(address)
                if known is not None and known[1]() is not None:  # alive: the address is that storage
                    for source in known[0]:
                        sources[source] = sources.get(source, 0) + nbytes
            self._sources[name] = sources
            if self._recorder is not None:
                self._recorder.open(name, set(storages))

    def _called_outside(self, parent: str) -> None:
        """A module named inside ``parent`` runs outside ``parent``'s first call: ``parent`` and
        each of its enclosing modules not running now would cover, by name, a layer they do not
        run (the profile names a module's layers after its first name, wherever it is called)."""
        while parent:
            if parent not in self._inputs:
                self._unsafe.setdefault(parent, "a module inside it is also called outside it")
            parent = parent.rpartition(".")[0]

    def _exit(self, name: str, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        inputs = self._inputs.pop(name, None)
        if inputs is not None:
            if self._recorder is not None:
                self._recorder.close(name)
            outputs = output if isinstance(output, (tuple, list)) else (output,)
            storages = _storages(outputs)
            self._output_bytes[name] = sum(n for key, n in storages.items() if key not in inputs)
            for value in outputs:
                if isinstance(value, torch.Tensor):
                    address = value.untyped_storage().data_ptr()
                    known = self._outputs.get(address)
                    if known is None or known[1]() is None:
                        self._outputs[address] = ([name], weakref.ref(value))
                    elif name not in known[0]:
                        known[0].append(name)
            audit = self._audits.get(name)
            if audit is not None and self._records_of is not None:
                self._input_records[name] = self._whole_input_records(audit.call_tensors, self._records_of)
                self._returned_inputs[name] = {
                    tensor.untyped_storage().data_ptr(): StorageWeakReference(tensor.untyped_storage())
                    for tensor in audit.call_tensors
                }
            reason = None if audit is None else audit.after_call(output)
            if reason is not None:
                self._unsafe.setdefault(name, reason)

    def _taken_again(self, storages: Iterable[int]) -> None:
        """A segment is called with the input ``storages``: a segment returned before that takes
        one of them too swaps none (recomputed, the later one saves it again as its input, which
        the profile does not see)."""
        for name, inputs in list(self._returned_inputs.items()):
            if any(address in inputs and not inputs[address].expired() for address in storages):
                self._input_records[name] = None
                del self._returned_inputs[name]

    @staticmethod
    def _whole_input_records(
        tensors: Iterable[torch.Tensor], records_of: RecordsOf
    ) -> tuple[list[tuple[int, list[StorageRecord]]], int] | None:
        """Per input storage, its bytes and the engine's records of it, with the pass's saves so
        far; ``None`` where a tensor argument does not hold its storage whole (dense, from its
        start to its end: :func:`~lightning_accudnn.tensor_layout.holds_storage_whole`) or the engine
        has not saved it."""
        found = []
        saves = 0
        seen: set[int] = set()
        for tensor in tensors:
            storage = tensor.untyped_storage()
            address = storage.data_ptr()
            if address in seen:
                continue
            seen.add(address)
            if not holds_storage_whole(tensor):
                return None
            records, saves = records_of(tensor)
            if not records:
                return None
            found.append((storage.nbytes(), records))
        return found, saves

    def settle_inputs(self) -> None:
        """The engine's forward is over (the storages the model's code holds beyond it found):
        each segment's inputs the engine may swap when it recomputes it, from the records its
        call's return found (:attr:`~lightning_accudnn.profile.SegmentProfile.swappable_input_bytes`)."""
        if not self._input_records:  # every pass but a profiling one: nothing to settle
            return
        for name, found in self._input_records.items():
            if found is None:
                continue
            inputs, saves = found
            if any(r.last_save > saves for _, records in inputs for r in records):
                continue  # saved again after the call: the segment's swap would copy it too
            swappable = [
                size
                for size, records in inputs
                if all(r.swappable and not r.read_in_forward for r in records)
            ]
            if swappable:
                self._swappable_inputs[name] = (sum(swappable), len(swappable))
        self._input_records, self._returned_inputs = {}, {}

    def _check_returned(self) -> None:
        """Whether a returned candidate's arguments or outputs were written in place since its call."""
        for name, audit in self._audits.items():
            if name in self._unsafe or name in self._inputs:  # unsafe already, or still running
                continue
            reason = audit.tensors_written()
            if reason is not None:
                self._unsafe[name] = reason

    def finish_forward(self) -> None:
        """The forward pass is over: check what happened after each candidate's call (its
        module state, its arguments and outputs written in place since)."""
        self._stop_recording()
        audits, self._audits = self._audits, {}
        for name, audit in audits.items():
            reason = audit.after_forward()
            if reason is not None:
                self._unsafe.setdefault(name, reason)

    def segments(self) -> tuple[SegmentProfile, ...]:
        """The segments of the last pass that may be recomputed, in the order they were first called."""
        segments = []
        for name in self._candidates():
            if name in self._unsafe:
                continue
            kept, share, rebuilt = self._measured.get(name, (None, 1.0, None))
            swappable, storages = self._swappable_inputs.get(name, (0, 0))
            segments.append(
                SegmentProfile(
                    name,
                    self._input_bytes[name],
                    self._output_bytes.get(name, 0),
                    tuple(self._sources.get(name, {}).items()),
                    selective_kept_bytes=kept,
                    selective_recompute_share=share,
                    selective_recomputed_bytes=rebuilt,
                    swappable_input_bytes=swappable,
                    swappable_input_storages=storages,
                )
            )
        return tuple(segments)

    def excluded(self) -> tuple[ExcludedSegment, ...]:
        """The candidates of the last pass that a recomputation would not replay exactly, with why
        (after them, in a pass that measured selective recomputation, the candidates that only a
        selective recomputation would not replay exactly: they are still recomputed whole)."""
        candidates = self._candidates()
        unsafe = tuple(
            ExcludedSegment(name, self._unsafe[name]) for name in candidates if name in self._unsafe
        )
        return unsafe + tuple(
            ExcludedSegment(name, f"not recomputed selectively: {self._not_selective[name]}")
            for name in candidates
            if name in self._not_selective and name not in self._unsafe
        )

    def _candidates(self) -> list[str]:
        """Modules called once, under the engine's hooks only, in the order they were first called."""
        foreign = self._foreign
        result = []
        for name in self._input_bytes:
            if self._calls.get(name) != 1:
                continue
            prefix = name + "."
            if any(
                other == name or other.startswith(prefix) or name.startswith(other + ".") for other in foreign
            ):
                continue
            result.append(name)
        return result


def _seen(recorder: SelectiveRecorder, pack: Callable[[torch.Tensor], Any], tensor: torch.Tensor) -> Any:
    """A saved tensor on its way to the engine's ``pack``, shown to the selective recorder."""
    recorder.saved(tensor)
    return pack(tensor)


def _storages(values: Iterable[object]) -> dict[int, int]:
    """Distinct storages of the tensors among ``values``: address -> bytes."""
    storages: dict[int, int] = {}
    for value in values:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return storages
