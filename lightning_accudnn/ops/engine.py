"""The offload engine: saved-tensor hooks that swap activations out in forward and back in backward.

Device memory follows GPU (stream) order, never CPU timing: a swapped storage's device
bytes are held in an in-flight FIFO after its copy out is enqueued and dropped only after
the compute stream waited on that copy (when the schedule's copy-out limit needs the room,
or when backward consumes it); copies back land in memory allocated on the compute stream;
nothing polls or synchronizes the device. So the ledger (and the allocator) follow a
deterministic function of the model and the schedule, however far the CPU runs ahead.

Usage from a plain PyTorch loop (Lightning's strategy does the same)::

    engine = OffloadEngine(device=torch.device("cuda"))
    for x, y in loader:
        with engine.offload(model, SwapSchedule.swap_everything()):
            loss = loss_fn(model(x), y)
        loss.backward()
        stats = engine.end_step()
        optimizer.step(); optimizer.zero_grad()
    engine.close()
"""

from __future__ import annotations

import contextvars
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from lightning_accudnn.ops._torch_internals import StorageWeakReference
from lightning_accudnn.ops.errors import StaleSavedTensorError
from lightning_accudnn.ops.layers import (
    FILTERED,
    PINNED,
    REUSED,
    SMALL,
    SWAPPABLE,
    LayerTracker,
    SaveSequence,
)
from lightning_accudnn.ops.ledger import DeviceLedger
from lightning_accudnn.ops.pool import HostBufferPool
from lightning_accudnn.ops.replay import KEEP_NEW, LEAVE, RECORD, SWAP_AGAIN, SWAP_WHOLE, ReplayRoute
from lightning_accudnn.ops.runtime import Runtime, StreamEvent, make_runtime
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.ops.stash import (
    DeviceBlock,
    FetchedCopy,
    StorageRecord,
    byte_extent,
    lineage_root,
    modified_in_place_error,
    record_extent,
    saved_view,
)
from lightning_accudnn.ops.timing import LayerTimer, PassTimer, clock_for
from lightning_accudnn.ops.weight_copies import WeightCopies
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES, ROOT_LAYER, LayerProfile

#: The layer a saved tensor is attributed to when, in a pass replayed by ordinal, the graph
#: departed from the profiled sequence (an unknown name: a plan swaps it, the safe side).
CHANGED_GRAPH_LAYER = "(changed graph)"

#: :attr:`.StorageRecord.copy_out` of a record whose copy out waits for the rest of its group.
_NOT_ISSUED: object = object()
_NOTHING_WAITED: object = object()  # the compute stream has waited on no event of this engine yet

#: A group of copies out is issued at the end of a layer once it holds this many bytes or this
#: many storages (or when a wait needs one of them, or the forward ends): a group of small
#: storages spans layers, so that its event, its waits and its stream switches are shared.
COPY_GROUP_BYTES = 4 * 2**20
COPY_GROUP_STORAGES = 16

_keep_on_device_depth: contextvars.ContextVar[int] = contextvars.ContextVar("keep_on_device", default=0)


@contextmanager
def keep_on_device() -> Iterator[None]:
    """Activations saved inside this block are never swapped (e.g. a small output head).

    Example:
        >>> with keep_on_device():
        ...     pass  # logits = self.head(features)
    """
    token = _keep_on_device_depth.set(_keep_on_device_depth.get() + 1)
    try:
        yield
    finally:
        _keep_on_device_depth.reset(token)


@dataclass(frozen=True)
class StepStats:
    """What the engine measured over one step (forward and backward).

    ``ledger_peak_bytes`` is the peak of the engine's ledger: model state plus saved
    activations, as the engine counts them (on CUDA the allocator's figures sit beside it).

    Example:
        >>> stats = StepStats(100, 100, 0.0, 500, 1, 0.01, 0.02, layers=())
        >>> stats.ledger_peak_bytes
        500
    """

    bytes_swapped_out: int
    bytes_swapped_in: int
    wait_seconds: float
    ledger_peak_bytes: int
    swapped_layers: int
    forward_seconds: float
    backward_seconds: float
    layers: tuple[LayerProfile, ...] = field(repr=False)
    """Per saving layer: bytes saved and swappable, forward self time, a share of the backward.

    A layer's ``forward_seconds`` is its self time plus that of the layers before it which
    saved nothing (so the layers' times add up to the forward pass); ``backward_seconds``
    shares the measured backward time out in proportion to forward time. Times are zero in a
    pass replayed by ordinal (``timed`` false)."""
    timed: bool = True
    """Whether layers were hooked and timed (a pass run without a ``sequence``)."""
    sequence: SaveSequence | None = field(default=None, repr=False)
    """The saves of a hooked pass, to replay the next passes of the same graph by ordinal."""
    graph_changed: bool = False
    """A pass replayed by ordinal saved a different sequence: its layers are not to be trusted."""
    layers_read_in_forward: frozenset[str] = frozenset()
    """Layers (of a hooked pass) whose saves a backward inside the forward read (a gradient
    penalty): their saves outlive that backward, so their segments must not be recomputed."""
    observed: bool = True
    """Whether every save of the pass passed the engine's hooks. A pass replayed unobserved
    (see :meth:`OffloadEngine.offload`: no hook when it keeps everything, hooks up to its last
    swapped save otherwise) reports the layers and the ledger peak of the last observed pass
    of its sequence under the same schedule, and cannot see a change of the graph where no
    hook was."""
    storages_swapped_out: int = 0
    """Copies to the host in the step: one per swapped storage (or the part of one that a
    view lineage saved), however many times it was saved."""


class _StorageEntry:
    """One device storage saved in this step: its block, and the records copying parts of it."""

    __slots__ = ("storage", "block", "records", "first_save")

    def __init__(self, storage: StorageWeakReference, block: DeviceBlock, first_save: int) -> None:
        self.storage = storage
        self.block = block
        self.records: list[StorageRecord] = []
        self.first_save = first_save  # the ordinal of its first save in the step


class _StepState:
    """Bookkeeping of the step in progress.

    Saves kept on the fast path of a replayed pass have no record: their storages are
    counted here by *group*, the ordinal of the storage's first save, in lists indexed by
    ordinal (``kept_pending[group]`` saves not unpacked yet, ``kept_nbytes[group]`` the bytes
    counted; ``kept_open`` groups still pending; ``kept_address`` only for a runtime that
    tracks blocks), and ``unpacked`` marks the ordinals unpacked once in backward (later
    unpacks, a retained graph's, count nothing).
    Saves through the records are numbered in the step; ``handle_unpacked`` marks those
    unpacked once.

    Autograd's handles to the step's saves refer to this object, so it lives as long as
    the graph (or the engine) does: when it dies, the host buffers of its swapped records go
    back to the pool (:meth:`OffloadEngine._watch`), one finalizer per step, not per tensor.
    """

    def __init__(self, replayed_saves: int = 0) -> None:
        self.by_storage: dict[int, _StorageEntry] = {}
        self.kept_pending = [0] * replayed_saves
        self.kept_nbytes = [0] * replayed_saves
        self.kept_open = 0
        self.kept_address: dict[int, int] = {}
        self.unpacked = bytearray(replayed_saves)
        self.handle_unpacked = bytearray()  # per save through the records, in pack order
        self.records: list[StorageRecord] = []  # every record opened in the step
        self.whole: dict[int, StorageRecord] = {}  # replayed pass: records swapped whole, by opening ordinal
        self.held_records = 0  # records whose device bytes are still the engine's
        self.watched = False  # its swapped records' host buffers go back when it dies
        self.read_in_forward: set[int] = set()  # fast saves unpacked in forward: their ordinals
        self.layers_read_in_forward: set[str] = set()  # hooked pass: layers of the records read there
        self.aborted = False
        self.observed = True  # its saves pass the hooks (see OffloadEngine.offload)
        self.swapped: list[StorageRecord] = []  # by last save: the order backward needs them in
        self.copying_out: deque[StorageRecord] = deque()  # in-flight FIFO, in issue order
        self.copying_out_bytes = 0  # of the records still in it (``in_fifo``)
        self.copying_out_count = 0
        self.next_prefetch = -1  # in swapped: the next to bring back, from begin_backward on (-1: none)
        self.window_used = 0
        self.window_full = False  # the last prefetch stopped at the window: none is due before it shrinks
        self.bytes_out = 0
        self.bytes_in = 0
        self.layer_saved: dict[str, int] = {}
        self.layer_swappable: dict[str, int] = {}
        self.layer_small: dict[str, list[int]] = {}  # sizes kept only for being below min_swap_bytes
        # Hooked pass: per record saved again by another layer, the saving layer (by its index in
        # ``layer_saved``) from whose backward on the record is needed: the last re-save's.
        self.resaved_from: dict[StorageRecord, int] = {}
        # Of those, the ones whose last re-save was by a layer that saved nothing of its own:
        # that layer (``LayerProfile.resaved_by_module``).
        self.resaved_module: dict[StorageRecord, str] = {}


class OffloadEngine:
    """Swaps saved activations of chosen layers to host memory and prefetches them back.

    Inside :meth:`offload`, every tensor autograd saves passes a filter (on the engine's
    device, a plain strided tensor, not a parameter, buffer or view of one) and is
    attributed to the layer running now. Storages of at least ``min_swap_bytes`` in layers
    the :class:`SwapSchedule` names, outside excluded modules and :func:`keep_on_device`,
    are copied to pooled host buffers on the runtime's copy stream; their device bytes are
    held in an in-flight FIFO and dropped, oldest first, once the compute stream waited on
    their copy, whenever the FIFO holds more than ``max_copying_out_bytes`` and more than
    one storage. In backward the engine brings swapped storages back in reverse order of
    their last save into memory allocated on the compute stream, within the schedule's
    prefetch window, and the compute waits only for data it reads now. ``runtime`` is the
    device (see :mod:`.runtime`); by default CUDA streams on a GPU and host copies on CPU.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
        >>> with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        ...     loss = model(torch.randn(32, 64)).sum()
        >>> loss.backward()
        >>> engine.end_step().bytes_swapped_out > 0
        True
        >>> engine.close()
    """

    def __init__(
        self,
        device: torch.device,
        *,
        min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES,
        exclude: Iterable[str] = (),
        host_memory_limit: int = 2**62,
        runtime: Runtime | None = None,
    ) -> None:
        self.runtime: Runtime = runtime if runtime is not None else make_runtime(device)
        self._tracks_blocks = self.runtime.tracks_blocks
        self.device = self.runtime.device
        self.min_swap_bytes = min_swap_bytes
        self.pool = HostBufferPool(pin_memory=self.runtime.pin_memory, capacity_bytes=host_memory_limit)
        self.ledger = DeviceLedger()
        self.timer = LayerTimer(clock_for(self.device))
        self.pass_timer = PassTimer(self.timer.clock)  # passes replayed by ordinal (no layer marks)
        self.tracker = LayerTracker(
            exclude=tuple(exclude), on_enter=self.timer.enter, on_exit=self.timer.exit
        )
        self._schedule = SwapSchedule.keep_everything()
        self._model_storages: set[int] = set()
        self._model_pointers: set[int] = set()  # the parameters' and buffers' own addresses
        self.weight_copies = WeightCopies()  # autocast's copies of parameters: kept, counted apart
        self._storages_model: object = None  # the model ``_model_storages`` belongs to
        self._recording: SaveSequence | None = None  # hooked pass: the saves, in order
        self._replaying: SaveSequence | None = None  # pass attributed by ordinal (no hooks)
        self._route: ReplayRoute | None = None  # ``_replaying`` compiled for the schedule
        self._calls = 0  # tensors given to the pack hook in this pass: the ordinal of the next
        self._departed = -1  # replayed pass: the first ordinal off the sequence (graph changed)
        self._fast_end = 0  # replayed pass: ordinals below it may take the fast path (0 once departed)
        self._replayed_layers: tuple[object, tuple[LayerProfile, ...]] | None = None  # last report
        self._last_observed: tuple[ReplayRoute, int] | None = None  # an observed replay: its activation peak
        self._device_index = -1  # of ``device`` for the filter (-1: the CPU), set by :meth:`offload`
        self._step: _StepState | None = None
        self._hooked = False
        self._saved_tensor_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._unhook_after = -1  # a pass replayed unobserved: the hooks go after this ordinal
        self._in_forward = False
        self._static_bytes = 0
        self._lingering: list[FetchedCopy] = []  # copies brought back, dropped: freed once their storage died
        # The event the compute stream waited on last: the records of one group of copies share
        # its event, and compute waits on it once (a wait on it again would order nothing more).
        self._compute_waited_on: object = _NOTHING_WAITED
        # The group of copies out not issued yet (:meth:`_issue_copies_out`): records, sources,
        # hosts, bytes
        self._copies_out: list[StorageRecord] = []
        self._copies_out_bytes = 0
        self._copy_sources: list[torch.Tensor] = []
        self._copy_hosts: list[torch.Tensor] = []
        self._watches: set[weakref.ref[_StepState]] = set()  # steps whose host buffers are still out

    # -- the step -------------------------------------------------------------------

    @contextmanager
    def offload(
        self,
        model: nn.Module,
        schedule: SwapSchedule,
        static_bytes: int = 0,
        sequence: SaveSequence | None = None,
        *,
        observe: bool = True,
    ) -> Iterator[None]:
        """Run the forward passes inside under ``schedule``; the first saved tensor opens a step.

        Without ``sequence`` every module is hooked and timed, and the step's
        :attr:`StepStats.sequence` records who saved what. With the ``sequence`` of an
        earlier pass of the same graph no module hook is installed and nothing is timed: each
        saved tensor is attributed by its ordinal, and a save that departs from the sequence
        marks the step ``graph_changed`` (its saves then count under
        :data:`CHANGED_GRAPH_LAYER`, which a plan swaps). The parameters' storages are
        re-read in hooked passes and whenever the model object changes.

        With ``observe=False`` and a ``sequence``, the pass is replayed unobserved: the hooks
        stay only up to the last save the schedule has the engine's records take
        (:attr:`.ReplayRoute.last_recorded`: the last swapped one), and autograd keeps every
        later save as it does without the engine, which costs nothing per saved tensor. A
        schedule that keeps everything thus installs no hook at all; one that swaps the
        first layers of the forward pays for the hooks of those layers only. The step then
        reports the layers and the ledger peak of the last observed pass of that sequence
        under that schedule (:attr:`StepStats.observed` false), and a changed graph after the
        hooks went goes unseen until a pass is observed again: the caller observes one now
        and then. The engine observes anyway when it has observed no pass of the sequence
        under the schedule yet, and keeps the hooks to the end of a pass that departs from
        the sequence before its last recorded save. An unobserved block holds one pass:
        after :meth:`end_step` inside it, nothing more is seen (the next :meth:`end_step`
        returns ``None``).

        ``static_bytes`` (model state) starts the ledger of each step opened inside. The
        block may hold backward passes too (Lightning's manual optimization): call
        :meth:`begin_backward` before each, and :meth:`end_step` after. On leaving the block
        normally the forward is over and prefetching starts; on an exception the step is
        aborted: hooks removed, host buffers back in the pool.
        """
        if self._hooked:
            raise RuntimeError("OffloadEngine.offload is not re-entrant: a forward pass is already hooked")
        self._schedule = schedule
        self._static_bytes = static_bytes
        index = self.device.index
        self._device_index = -1 if self.device.type == "cpu" else index if index is not None else 0
        if sequence is None or model is not self._storages_model:
            self._model_storages = _storages_of(model)
            self._model_pointers = _pointers_of(model)
            self._storages_model = model
        self._replaying = sequence
        self._recording = SaveSequence() if sequence is None else None
        self.runtime.timing = sequence is None  # no timing events in passes replayed by ordinal
        self.runtime.begin_pass()
        if sequence is not None and (self._route is None or not self._route.compiled_for(sequence, schedule)):
            self._route = ReplayRoute(sequence, schedule)
        self._restart_ordinals()
        # Only a replayed pass may skip saves (a hooked pass records; the route is this one's).
        unobserved = not observe and sequence is not None and self._observed_peak(self._route) is not None
        route = self._route
        self._unhook_after = route.last_recorded if unobserved and route is not None else -1
        hooks = None
        if unobserved and self._unhook_after < 0:  # it keeps everything: no hook at all
            assert route is not None
            self._calls = len(route)  # as if every save was seen: the step reports them all
            self._open_step().observed = False
        else:
            hooks = torch.autograd.graph.saved_tensors_hooks(
                self._pack_recorded if sequence is None else self._pack_replayed, self._unpack
            )
        if self._step is None and sequence is None:
            self.timer.start()
        self._hooked = True
        try:
            with self.tracker.attached(model) if sequence is None else nullcontext():
                if hooks is not None:
                    hooks.__enter__()
                    self._saved_tensor_hooks = hooks
                try:
                    yield
                finally:
                    self._unhook()
        except BaseException:
            self.abort_step()
            raise
        finally:
            self._hooked = False
        self.begin_backward()

    def _unhook(self) -> None:
        """Remove the saved-tensor hooks of the pass, if still there."""
        hooks, self._saved_tensor_hooks = self._saved_tensor_hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    def _stop_observing(self) -> None:
        """A pass replayed unobserved saved the last tensor that its route records: the hooks
        go (this runs inside the pack hook, where they are the innermost), and the saves after
        it stay with autograd unseen. The step reports them all, as an unobserved one does."""
        assert self._route is not None and self._step is not None
        self._unhook()
        self._calls = len(self._route)
        self._step.observed = False

    def begin_backward(self) -> None:
        """The forward pass is over: start prefetching.

        Swapped storages come back in reverse order of their last save: one saved by
        several layers (a block's input, saved by the block before and by its first
        convolution and downsample) is needed when backward reaches the last of them.
        Storages still in the copy-out FIFO stay on the device and are used from there.
        """
        self._in_forward = False
        self.runtime.begin_pass()
        self._issue_copies_out()
        self.timer.end_forward()
        self.pass_timer.end_forward()
        step = self._step
        if step is not None:
            step.swapped.sort(key=lambda record: record.last_save)
            step.next_prefetch = len(step.swapped) - 1
        self._prefetch()

    def end_step(self) -> StepStats | None:
        """Close the step after backward and report what was measured.

        What is still in the copy-out FIFO is dropped after the compute stream waited on its
        copy (stream order; the CPU does not wait). Returns ``None`` when no step is open
        (nothing was saved since the last call).
        """
        step = self._step
        if step is None:
            return None
        self._in_forward = False
        self.timer.end_backward()
        while step.copying_out:
            self._retire(step, step.copying_out.popleft())
        if step.held_records:
            self._release_devices(step)
        self._reap()
        self._release_lingering()
        self._release_kept(step)
        replaying, recording = self._replaying, self._recording
        graph_changed = replaying is not None and (self._departed >= 0 or self._calls != len(replaying))
        if step.observed and replaying is not None and self._route is not None:
            self._last_observed = None if graph_changed else (self._route, self.ledger.peak_activation_bytes)
        elif not step.observed:
            peak = self._observed_peak(self._route)
            assert peak is not None
            self.ledger.peak_activation_bytes = peak
        if recording is not None:
            layers = self._layer_usage(step)
            forward_seconds = sum(layer.forward_seconds for layer in layers)
            backward_seconds = sum(layer.backward_seconds for layer in layers)
        else:
            layers = self._untimed_layers(step)
            forward_seconds, backward_seconds = self.pass_timer.end_backward()
        stats = StepStats(
            bytes_swapped_out=step.bytes_out,
            bytes_swapped_in=step.bytes_in,
            wait_seconds=self.runtime.collect_wait_seconds(),
            ledger_peak_bytes=self.ledger.peak_bytes,
            swapped_layers=len({record.layer for record in step.swapped}),
            forward_seconds=forward_seconds,
            backward_seconds=backward_seconds,
            layers=layers,
            timed=recording is not None,
            sequence=recording,
            graph_changed=graph_changed,
            layers_read_in_forward=frozenset(step.layers_read_in_forward),
            observed=step.observed,
            storages_swapped_out=len(step.swapped),
        )
        self._step = None
        self._recording = SaveSequence() if recording is not None else None  # next pass in the block
        self._restart_ordinals()
        self.timer.reset()
        return stats

    def _untimed_layers(self, step: _StepState) -> tuple[LayerProfile, ...]:
        """Bytes per saving layer of a replayed pass: the records of its fast saves and of its
        storages swapped whole are those of the profiled pass (:meth:`.ReplayRoute.layer_bytes`),
        the others counted now."""
        route = self._route
        assert route is not None
        end = self._departed if self._departed >= 0 else self._calls
        fast_saved, fast_swappable = route.layer_bytes(end)
        read_in_forward = self._fast_read_in_forward(route, step)
        key = (route, end, step.layer_saved, step.layer_swappable, read_in_forward)
        if self._replayed_layers is not None and self._replayed_layers[0] == key:
            return self._replayed_layers[1]  # the same as the last replayed pass: no new objects
        swappable = dict(fast_swappable)
        sequence = route.sequence
        for ordinal in read_in_forward:
            layer = sequence.layers[ordinal]
            swappable[layer] -= sequence.record_bytes[ordinal]
        order = dict.fromkeys(route.first_records(end))
        order.update(dict.fromkeys(step.layer_saved))
        layers = tuple(
            LayerProfile(
                name,
                saved_bytes=fast_saved.get(name, 0) + step.layer_saved.get(name, 0),
                swappable_bytes=swappable.get(name, 0) + step.layer_swappable.get(name, 0),
            )
            for name in order
            if name in fast_saved or name in step.layer_saved
        )
        self._replayed_layers = (key, layers)
        return layers

    @staticmethod
    def _fast_read_in_forward(route: ReplayRoute, step: _StepState) -> frozenset[int]:
        """The swappable records (by opening ordinal) of fast saves unpacked in forward."""
        if not step.read_in_forward:
            return frozenset()
        sequence = route.sequence
        opened = {sequence.record_of[ordinal] for ordinal in step.read_in_forward}
        return frozenset(ordinal for ordinal in opened if sequence.kinds[ordinal] == SWAPPABLE)

    def _layer_usage(self, step: _StepState) -> tuple[LayerProfile, ...]:
        """Bytes and times per saving layer; time of layers that saved nothing goes to the next one."""
        self_seconds = self.timer.forward_self_seconds()
        forward: dict[str, float] = dict.fromkeys(step.layer_saved, 0.0)
        pending, last_saving = 0.0, None
        for layer in self.tracker.order:
            if layer == ROOT_LAYER:
                continue
            pending += self_seconds.get(layer, 0.0)
            if layer in forward:
                forward[layer] += pending
                pending, last_saving = 0.0, layer
        rest = pending + self_seconds.get(ROOT_LAYER, 0.0)
        if ROOT_LAYER in forward or last_saving is None:
            forward[ROOT_LAYER] = forward.get(ROOT_LAYER, 0.0) + rest
        else:
            forward[last_saving] += rest
        total_forward = sum(forward.values())
        backward = self.timer.backward_seconds()
        resaved, resaved_modules = self._resaved_by(step)
        return tuple(
            LayerProfile(
                name,
                saved_bytes=step.layer_saved.get(name, 0),
                swappable_bytes=step.layer_swappable.get(name, 0),
                forward_seconds=forward[name],
                backward_seconds=backward * forward[name] / total_forward if total_forward > 0 else 0.0,
                small_storages=tuple(step.layer_small.get(name, ())),
                resaved_by=tuple(resaved.get(name, {}).items()),
                resaved_by_module=tuple(resaved_modules.get(name, {}).items()),
            )
            for name in forward
        )

    def abort_step(self) -> None:
        """Drop the step in progress: every swapped record is released and marked stale.

        Nothing another stream may still touch is dropped before the compute stream waited
        on the copy touching it.
        """
        step, self._step = self._step, None
        if step is None:
            return
        step.aborted = True
        self._restart_ordinals()
        self._release_kept(step)
        self._release_devices(step)
        self._release_hosts(step.swapped)
        self._release_lingering()
        self.runtime.collect_wait_seconds()

    def _release_lingering(self) -> None:
        """The step is over: copies still referenced elsewhere are no longer the engine's."""
        for copy in self._lingering:
            self._leave_device(copy.nbytes, copy.key, copy.in_prefetch_window)
        self._lingering = []

    def close(self) -> None:
        """Abort any open step and free the idle host buffers."""
        self.abort_step()
        self.pool.trim()

    @property
    def step_open(self) -> bool:
        return self._step is not None

    # -- hooks ----------------------------------------------------------------------

    def _pack_recorded(self, tensor: torch.Tensor) -> object:
        """A save in a hooked pass: attributed to the layer running now, and noted in the sequence."""
        ordinal = self._calls
        self._calls = ordinal + 1
        recording = self._recording
        assert recording is not None
        layer, excluded = self.tracker.current, self.tracker.excluded
        found = self._activation_storage(tensor)
        if found is None:
            recording.append(layer, excluded, 0, kind=FILTERED)
            return tensor
        storage, key, storage_nbytes = found
        step = self._open_step()
        packed, record, opened = self._pack_record(
            step, ordinal, tensor, storage, key, storage_nbytes, layer, excluded
        )
        recording.append(
            layer,
            excluded,
            storage_nbytes,
            tensor_bytes=tensor.nbytes,
            group=step.by_storage[key].first_save,
            record_bytes=record.nbytes,
            kind=record.kind if opened else REUSED,
            record_of=record.ordinal,
        )
        return packed

    def _pack_replayed(self, tensor: torch.Tensor) -> object:
        """A save in a pass replayed by ordinal; the hot path.

        What the profiled pass did at this ordinal decides (:class:`.ReplayRoute`), checked by
        the tensor's size: a tensor that was no activation goes back to autograd untouched; one
        whose storage the plan keeps costs a few dict operations (autograd keeps
        ``(tensor, version, group, ordinal, step)``, its storage is counted by the ordinal of
        its first save, with the storage's bytes the profiled pass measured); a storage swapped
        whole opens its record, and is saved again through it, without the filter
        (:meth:`_pack_whole`, :meth:`_pack_again`); the rest go through the full filter and the
        records. A size that differs marks the graph changed:
        from there on every save goes through the filter and the records."""
        ordinal = self._calls
        self._calls = ordinal + 1
        route = self._route
        assert route is not None
        if ordinal < self._fast_end:
            action = route.actions[ordinal]
            if action == LEAVE:
                return tensor
            sequence = route.sequence
            if action < RECORD:  # KEEP_NEW, KEEP_AGAIN
                try:
                    same = tensor.nbytes == sequence.tensor_bytes[ordinal]
                except RuntimeError:  # a sparse tensor (no nbytes): not what was profiled
                    same = False
                if same:
                    step = self._step
                    if step is None or not self._in_forward:
                        step = self._open_step()
                    if action == KEEP_NEW:
                        nbytes = sequence.sizes[ordinal]
                        step.kept_pending[ordinal] = 1
                        step.kept_nbytes[ordinal] = nbytes
                        step.kept_open += 1
                        ledger = self.ledger  # DeviceLedger.acquire, inline: the hot path
                        current = ledger.activation_bytes + nbytes
                        ledger.activation_bytes = current
                        if current > ledger.peak_activation_bytes:
                            ledger.peak_activation_bytes = current
                        if self._tracks_blocks:
                            address = step.kept_address[ordinal] = tensor.data_ptr()
                            self.runtime.hold(address, nbytes)
                        return (tensor, tensor._version, ordinal, ordinal, step)
                    group = sequence.groups[ordinal]
                    pending = step.kept_pending[group]
                    if pending:
                        step.kept_pending[group] = pending + 1
                        return (tensor, tensor._version, group, ordinal, step)
            else:
                if action == SWAP_WHOLE:
                    packed = self._pack_whole(
                        tensor,
                        ordinal,
                        sequence.sizes[ordinal],
                        sequence.layers[ordinal],
                        route.group_ends[ordinal],
                    )
                elif action == SWAP_AGAIN:
                    packed = self._pack_again(tensor, ordinal, sequence.record_of[ordinal])
                else:
                    packed = None
                    found = self._activation_storage(tensor)
                    if found is not None and found[2] == sequence.sizes[ordinal]:
                        storage, key, storage_nbytes = found
                        layer, excluded = sequence.layers[ordinal], sequence.excluded[ordinal]
                        step = self._open_step()
                        packed = self._pack_record(
                            step, ordinal, tensor, storage, key, storage_nbytes, layer, excluded
                        )[0]
                if packed is not None:
                    if ordinal == self._unhook_after:
                        self._stop_observing()
                    return packed
        if self._departed < 0:
            self._departed, self._fast_end = ordinal, 0
        found = self._activation_storage(tensor)
        if found is None:
            return tensor
        storage, key, storage_nbytes = found
        step = self._open_step()
        return self._pack_record(
            step, ordinal, tensor, storage, key, storage_nbytes, CHANGED_GRAPH_LAYER, False
        )[0]

    def _pack_whole(
        self, tensor: torch.Tensor, ordinal: int, nbytes: int, layer: str, group_ends: bool
    ) -> object:
        """A replayed save that opened the one record of a storage swapped whole
        (:data:`.SWAP_WHOLE`): checked to be that again (a plain dense tensor over its whole
        storage of the profiled size, on the device, no parameter, outside
        :func:`keep_on_device`), it opens that record without the filter, the extent arithmetic
        and the storage's entry (no other record of the storage can come). Its copy out is
        issued with those of the layer's other whole storages, at the last of them
        (``group_ends``: :attr:`.ReplayRoute.group_ends`). ``None`` when the check fails: the
        graph changed."""
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.nbytes != nbytes:
            return None
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if (
            storage.nbytes() != nbytes
            or tensor.storage_offset()
            or not (tensor.is_contiguous() or _is_dense(tensor))  # the common case: one call
            or not self._on_device(tensor)
            or key in self._model_storages
            or _keep_on_device_depth.get()
        ):
            return None
        step = self._step
        if step is None or not self._in_forward:
            step = self._open_step()
        # _start_copy_out's dense case, inline: the host buffer first (it may raise: nothing held
        # yet), laid out like the tensor, which is the copy's source itself; then the block held.
        buffer = self.pool.acquire(nbytes)
        dtype, shape, stride = tensor.dtype, tensor.shape, tensor.stride()
        host = self.pool.typed_view(buffer, dtype, shape, stride)
        block = DeviceBlock(key, nbytes, held=True)  # _hold_found, inline: a new block, counted now
        if self._tracks_blocks:
            self.runtime.hold(key, nbytes)
        ledger = self.ledger  # DeviceLedger.acquire, inline: the hot path
        current = ledger.activation_bytes + nbytes
        ledger.activation_bytes = current
        if current > ledger.peak_activation_bytes:
            ledger.peak_activation_bytes = current
        base = tensor._base  # lineage_root, inline: the hot path
        root = tensor if base is None else base
        # layer, extent, last save, swapped, swappable, root, block, opening ordinal, kind
        record = StorageRecord(layer, 0, nbytes, ordinal + 1, True, True, root, block, ordinal, SWAPPABLE)
        record.host_buffer, record.host_view = buffer, host
        dense = record.dense = (dtype, shape, stride, 0)
        step.whole[ordinal] = record  # its layer's bytes: ReplayRoute.layer_bytes
        step.held_records += 1
        step.records.append(record)
        if not step.watched:
            self._watch(step)
        self._enqueue_copy_out(step, record, storage, tensor, host, group_ends)
        index = len(step.handle_unpacked)  # _handle, inline: the hot path
        step.handle_unpacked.append(0)
        record.pending_unpacks = 1
        return (record, None, tensor._version, index, step, dense)

    def _pack_again(self, tensor: torch.Tensor, ordinal: int, opened_at: int) -> object:
        """A replayed save of a storage swapped whole, saved before in this step
        (:data:`.SWAP_AGAIN`): the record opened at ``opened_at`` serves it when it is the same
        lineage at the same version over the same storage (the record holds all its bytes).
        ``None`` when not: the graph changed."""
        step = self._step
        if step is None:
            return None
        record = step.whole.get(opened_at)
        if record is None or record.released or type(tensor) is not torch.Tensor:
            return None
        root = lineage_root(tensor)
        if (
            record.root() is not root
            or root._version != record.version
            or tensor.untyped_storage().data_ptr() != record.source_block.key
        ):
            return None
        if not self._in_forward:
            self._open_step()
        record.last_save = ordinal + 1
        return self._handle(step, record, tensor)

    def _activation_storage(self, tensor: torch.Tensor) -> tuple[torch.UntypedStorage, int, int] | None:
        """The filter: the storage, its address and size of an activation, ``None`` for the rest."""
        if not self._is_plain(tensor):
            return None
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._model_storages or self.weight_copies.recognise(tensor, self._model_storages):
            return None
        return storage, key, storage.nbytes()

    def _uncount_kept(self, step: _StepState, group: int) -> None:
        """The last pending save of a fast-kept storage was read (or the step ends): out of the count."""
        step.kept_pending[group] = 0
        step.kept_open -= 1
        self.ledger.activation_bytes -= step.kept_nbytes[group]
        if self._tracks_blocks:
            self.runtime.release(step.kept_address.pop(group))

    def _release_kept(self, step: _StepState) -> None:
        """The step ends (or aborts): fast-kept storages never read are no longer counted."""
        if step.kept_open:
            for group, pending in enumerate(step.kept_pending):
                if pending:
                    self._uncount_kept(step, group)

    def _pack_record(
        self,
        step: _StepState,
        ordinal: int,
        tensor: torch.Tensor,
        storage: torch.UntypedStorage,
        key: int,
        storage_nbytes: int,
        layer: str,
        excluded: bool,
    ) -> tuple[tuple[object, ...], StorageRecord, bool]:
        """A save through the records; returns its handle, its record and whether it opened it.

        The handle autograd keeps is a plain 6-tuple (no finalizer; a fast-kept save's has 5):
        ``(record, tensor, version, index, step, geometry)``: ``tensor`` is ``None`` for a
        swapped record, ``geometry`` the view's ``(dtype, shape, stride, offset)`` for a swapped
        record (:attr:`.StorageRecord.dense` itself for the save of a dense record's tensor)
        and ``None`` for a kept one; ``index`` numbers the step's saves through the records
        (:attr:`_StepState.handle_unpacked`)."""
        entry = step.by_storage.get(key)
        if entry is None or entry.storage.expired():
            block = DeviceBlock(key, storage_nbytes)
            entry = _StorageEntry(StorageWeakReference(storage), block, ordinal)
            step.by_storage[key] = entry
        root = lineage_root(tensor)
        extent = start, end = byte_extent(tensor)
        for record in entry.records:
            if record.serves(root, start, end):
                # Saved again by a later layer: backward needs it when it reaches that layer.
                record.last_save = ordinal + 1
                if self._recording is not None and record.swappable:
                    self._note_resave(step, record, layer)
                return self._handle(step, record, tensor), record, False
        record = self._new_record(step, entry, root, tensor, storage_nbytes, layer, excluded, extent, ordinal)
        entry.records.append(record)
        step.held_records += 1
        step.records.append(record)
        if record.swap:
            dense = record.start == 0 and record.nbytes == tensor.nbytes and not tensor.storage_offset()
            self._start_copy_out(step, record, storage, tensor, dense=dense and _is_dense(tensor))
        else:
            self._hold_found(record.source_block)
        return self._handle(step, record, tensor, record.dense), record, True

    @staticmethod
    def _handle(
        step: _StepState,
        record: StorageRecord,
        tensor: torch.Tensor,
        geometry: tuple[torch.dtype, torch.Size, tuple[int, ...], int] | None = None,
    ) -> tuple[object, ...]:
        """The handle of a save; ``geometry`` is the tensor's ``(dtype, shape, stride, offset)``
        when the caller has it (a dense record's first save: :attr:`.StorageRecord.dense`)."""
        index = len(step.handle_unpacked)
        step.handle_unpacked.append(0)
        record.pending_unpacks += 1
        if record.swap:
            if geometry is None:
                geometry = (tensor.dtype, tensor.shape, tensor.stride(), int(tensor.storage_offset()))
            return (record, None, tensor._version, index, step, geometry)
        return (record, tensor, tensor._version, index, step, None)

    @staticmethod
    def _note_resave(step: _StepState, record: StorageRecord, layer: str) -> None:
        """``layer`` saves ``record`` again. Its bytes are then needed from the start of the
        backward of ``layer``, or, if ``layer`` saves nothing of its own, of the next layer that
        does (its backward starts earlier: counting from there errs on the safe side; the layer
        itself is noted too)."""
        saving = list(step.layer_saved)
        if layer in step.layer_saved:
            step.resaved_from[record] = saving.index(layer)
            step.resaved_module.pop(record, None)
        else:
            step.resaved_from[record] = len(saving)
            step.resaved_module[record] = layer

    def _resaved_by(self, step: _StepState) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """Per saving layer, the bytes of its swappable records saved again, under the layer
        (of the profile) from whose backward on they are needed (:attr:`LayerProfile.resaved_by`),
        and the part of them saved again last by a layer that saved nothing of its own, under
        that layer (:attr:`LayerProfile.resaved_by_module`)."""
        saving = list(step.layer_saved)
        resaved: dict[str, dict[str, int]] = {}
        modules: dict[str, dict[str, int]] = {}
        for record, index in step.resaved_from.items():
            later = saving[min(index, len(saving) - 1)]
            if later != record.layer and not record.read_in_forward:
                per_layer = resaved.setdefault(record.layer, {})
                per_layer[later] = per_layer.get(later, 0) + record.nbytes
                module = step.resaved_module.get(record)
                if module is not None:
                    per_module = modules.setdefault(record.layer, {})
                    per_module[module] = per_module.get(module, 0) + record.nbytes
        return resaved, modules

    def _unpack(self, packed: object) -> torch.Tensor:
        """Give autograd back a save: the tensor itself (no activation), a fast-kept save checked
        (a 5-tuple), or a save through the records (a 6-tuple: see :meth:`_handle`)."""
        if type(packed) is not tuple:
            assert isinstance(packed, torch.Tensor)
            return packed
        if len(packed) == 5:
            # A fast-kept save: checked for in-place changes, uncounted at its storage's last read.
            tensor: torch.Tensor
            step: _StepState
            tensor, version, group, ordinal, step = packed
            if step is self._step:
                if self._in_forward:
                    step.read_in_forward.add(ordinal)  # a backward inside the forward: needed later
                elif not step.unpacked[ordinal]:
                    step.unpacked[ordinal] = 1
                    pending = step.kept_pending[group] - 1
                    if pending:
                        step.kept_pending[group] = pending
                    else:  # _uncount_kept, inline: the hot path
                        step.kept_pending[group] = 0
                        step.kept_open -= 1
                        self.ledger.activation_bytes -= step.kept_nbytes[group]
                        if self._tracks_blocks:
                            self.runtime.release(step.kept_address.pop(group))
                if self._lingering:
                    self._reap()
                if step.next_prefetch >= 0 and not step.window_full:
                    self._prefetch()
            elif step.aborted:
                raise _stale_error()
            if tensor._version != version:
                raise modified_in_place_error(tensor.dtype, tensor.shape, tensor._version, version)
            return tensor
        # A save through the records, its handle's fields (inline, not a call: the hot path).
        record: StorageRecord
        kept: torch.Tensor | None
        record, kept, version, index, step, geometry = packed
        if step.aborted:
            raise _stale_error()
        if self._lingering:
            self._reap()
        current = self._step
        if current is not None and current.next_prefetch >= 0 and not current.window_full:
            self._prefetch()
        if kept is not None:
            if kept._version != version:
                raise modified_in_place_error(kept.dtype, kept.shape, kept._version, version)
            tensor = kept
        else:
            assert geometry is not None
            if version != record.version:  # the copy holds a later version (see _issue_copies_out)
                raise modified_in_place_error(geometry[0], geometry[1], record.version, version)
            root = record.root()
            if root is not None and root._version != version:  # None: the lineage is gone, unchecked
                raise modified_in_place_error(geometry[0], geometry[1], root._version, version)
        if self._in_forward and not record.read_in_forward:
            self._mark_read_in_forward(record)
        if kept is None:
            if record.fetched is None:
                self._fetch(record)
            fetched = record.fetched
            assert fetched is not None
            ready = record.fetched_ready
            if ready is not None:
                record.fetched_ready = None
                if ready is self._compute_waited_on:  # _wait_once's test: the read needs no wait
                    ready = None
                else:
                    self._compute_waited_on = ready
            self.runtime.use_on_compute(fetched, ready)
            dense = record.dense
            if geometry is dense or geometry == dense:
                tensor = fetched  # the tensor saved, brought back whole or read where it was saved
            else:  # a view: of the bytes where they were saved, or of the copy from record.start
                assert geometry is not None
                start = 0 if record.fetched_copy is None else record.start
                tensor = saved_view(fetched, start, *geometry)
        if not step.handle_unpacked[index]:
            step.handle_unpacked[index] = 1
            record.pending_unpacks -= 1
        if record.pending_unpacks == 0 and not record.read_in_forward and not self._in_forward:
            self._release_device(step if step is self._step else None, record)
        return tensor

    def _mark_read_in_forward(self, record: StorageRecord) -> None:
        """A backward inside the forward (a gradient penalty) reads this record: it stays on the
        device until the step ends, and its bytes are reported as not swappable, so
        that the plan keeps them and counts them for the whole step."""
        record.read_in_forward = True
        step = self._step
        if step is not None:
            step.layers_read_in_forward.add(record.layer)
            if record.swappable:  # (a record swapped whole in a replayed pass is counted by its route)
                layer = record.layer
                step.layer_swappable[layer] = step.layer_swappable.get(layer, 0) - record.nbytes

    # -- filter and records -----------------------------------------------------------

    def _is_plain(self, tensor: torch.Tensor) -> bool:
        """The filter, but for views of the model's storages that start elsewhere: a plain
        strided tensor on the device, not a parameter or buffer (checked first: they are many)."""
        return (
            type(tensor) is torch.Tensor  # tensor subclasses (a jagged nested tensor, DTensor) stay
            and tensor.layout == torch.strided
            and tensor.data_ptr() not in self._model_pointers
            and self._on_device(tensor)
            and not tensor.is_nested
            and not tensor.is_quantized
            and not tensor.is_conj()
            and not tensor.is_neg()
        )

    def _on_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lives on the engine's device."""
        if self._device_index < 0:
            return tensor.is_cpu
        return tensor.is_cuda and tensor.get_device() == self._device_index

    def _new_record(
        self,
        step: _StepState,
        entry: _StorageEntry,
        root: torch.Tensor,
        tensor: torch.Tensor,
        storage_nbytes: int,
        layer: str,
        excluded: bool,
        extent: tuple[int, int],
        ordinal: int,
    ) -> StorageRecord:
        start, end = record_extent(root, tensor, storage_nbytes, extent)
        nbytes = end - start
        allowed = nbytes > 0 and not excluded and _keep_on_device_depth.get() == 0
        swappable = allowed and nbytes >= self.min_swap_bytes
        step.layer_saved[layer] = step.layer_saved.get(layer, 0) + nbytes
        if swappable:
            step.layer_swappable[layer] = step.layer_swappable.get(layer, 0) + nbytes
        elif allowed:
            step.layer_small.setdefault(layer, []).append(nbytes)
        swap = swappable and self._schedule.swaps(layer) and self._host_can_hold(nbytes)
        kind = SWAPPABLE if swappable else SMALL if allowed else PINNED
        block = entry.block
        # layer, extent, last save, swapped, swappable, root, block, opening ordinal, kind
        return StorageRecord(layer, start, end, ordinal + 1, swap, swappable, root, block, ordinal, kind)

    def _host_can_hold(self, nbytes: int) -> bool:
        """False only when the schedule keeps what passes the host cap and this would."""
        return not self._schedule.keep_beyond_host_limit or self.pool.can_hold(nbytes)

    def _hold_found(self, block: DeviceBlock) -> None:
        """Hold a saved storage; the ledger counts it, and the runtime learns of it, from its
        first holder on."""
        if block.hold():
            if self._tracks_blocks:
                self.runtime.hold(block.key, block.nbytes)
            ledger = self.ledger  # DeviceLedger.acquire, inline: the hot path
            current = ledger.activation_bytes + block.nbytes
            ledger.activation_bytes = current
            if current > ledger.peak_activation_bytes:
                ledger.peak_activation_bytes = current

    def _reap(self) -> None:
        """Free the lingering copies whose storage has died (after the backward op that read
        it): it runs ahead of every prefetch in backward, and the step's end frees the rest."""
        if not self._lingering:
            return
        alive = []
        for copy in self._lingering:
            if copy.storage.expired():
                self._leave_device(copy.nbytes, copy.key, copy.in_prefetch_window)
            else:
                alive.append(copy)
        self._lingering = alive

    def _free_block(self, block: DeviceBlock) -> None:
        """A saved storage the engine no longer needs (its last holder let go): out of the count at
        once, in compute order."""
        if not block.counted:
            return
        block.counted = False
        self._leave_device(block.nbytes, block.key, block.in_prefetch_window)
        block.in_prefetch_window = False

    def _leave_device(self, nbytes: int, key: int, in_prefetch_window: bool) -> None:
        """``nbytes`` at ``key`` leave the count (and the runtime's blocks), in compute order: a
        saved storage the engine no longer needs, or a copy brought back whose storage died or
        whose step ended."""
        self.ledger.activation_bytes -= nbytes  # DeviceLedger.release, inline: the hot path
        if self._tracks_blocks:
            self.runtime.release(key)
        # A prefetched block leaves the window when its last device reference dies (after
        # the backward op that used it), not when it is handed over: the window bounds memory.
        if in_prefetch_window:
            step = self._step
            if step is not None:
                step.window_used -= nbytes
                step.window_full = False

    def _release_device(self, step: _StepState | None, record: StorageRecord) -> None:
        """The record's device bytes are no longer needed (read for the last time, or the step
        ends): they leave the count in compute order. A swapped record keeps its host copy
        (a retained graph may read it again) until its step dies (:meth:`_watch`)."""
        if record.swap:
            if record.source_storage is not None:
                self._retire(step, record)
            if record.fetched is not None:  # the engine's reference to the bytes goes (views keep theirs)
                if record.fetched_ready is not None:  # never read: still order the free after the copy
                    self._wait_once(record.fetched_ready)
                    record.fetched_ready = None
                record.fetched = None
                block = record.fetched_block
                if block is not None:  # read where it was saved
                    record.fetched_block = None
                    if block.unhold():
                        self._free_block(block)
                else:  # a copy brought back lingers until its storage dies
                    copy = record.fetched_copy
                    assert copy is not None
                    record.fetched_copy = None
                    self._lingering.append(copy)
        elif not record.released and record.source_block.unhold():
            self._free_block(record.source_block)
        if not record.released:
            record.released = True
            if step is not None:
                step.held_records -= 1

    def _release_devices(self, step: _StepState) -> None:
        """Every record of the step gives its device bytes back (the step ends or aborts)."""
        for record in step.records:
            self._release_device(step, record)

    def _release_hosts(self, records: list[StorageRecord]) -> None:
        """Host buffers of swapped records back to the pool (their step is over or died)."""
        for record in records:
            buffer = record.host_buffer
            if buffer is not None:
                record.host_buffer = record.host_view = None
                self.runtime.release_host(buffer)
                self.pool.release(buffer)

    def _watch(self, step: _StepState) -> None:
        """Give the host buffers of the step's swapped records back to the pool when the step
        dies: when the engine has closed it and autograd has freed every handle to its saves
        (after backward, or when a graph is dropped without one)."""
        step.watched = True
        records = step.swapped
        watches = self._watches

        def died(reference: weakref.ref[_StepState]) -> None:
            watches.discard(reference)
            self._release_hosts(records)

        watches.add(weakref.ref(step, died))

    # -- copies ---------------------------------------------------------------------------

    def _start_copy_out(
        self,
        step: _StepState,
        record: StorageRecord,
        storage: torch.UntypedStorage,
        tensor: torch.Tensor,
        *,
        dense: bool,
    ) -> None:
        """Copy the record's bytes out: from ``tensor`` itself, typed, when ``dense`` (the tensor
        is the record whole, contiguous or channels-last: :attr:`.StorageRecord.dense`), else
        from a byte view of ``storage`` (:meth:`_pack_whole` does the dense case inline)."""
        nbytes = record.nbytes
        buffer = record.host_buffer = self.pool.acquire(nbytes)
        source: torch.Tensor
        if dense:
            dtype, shape, stride = tensor.dtype, tensor.shape, tensor.stride()
            record.dense = (dtype, shape, stride, 0)
            host = record.host_view = self.pool.typed_view(buffer, dtype, shape, stride)
            source = tensor
        else:
            host = record.host_view = self.pool.typed_view(buffer, torch.uint8, (nbytes,), (1,))
            source = torch.empty(0, dtype=torch.uint8, device=self.device).set_(
                storage, record.start, (nbytes,), (1,)
            )
        if not step.watched:
            self._watch(step)
        self._hold_found(record.source_block)
        self._enqueue_copy_out(step, record, storage, source, host, True)

    def _enqueue_copy_out(
        self,
        step: _StepState,
        record: StorageRecord,
        storage: torch.UntypedStorage,
        source: torch.Tensor,
        host: torch.Tensor,
        group_ends: bool,
    ) -> None:
        """The record's copy out (``source`` into ``host``) joins the group of copies not issued
        yet, issued as one when ``group_ends`` (a layer's last) and the group holds
        :data:`COPY_GROUP_BYTES` or :data:`COPY_GROUP_STORAGES` (or when a wait on one of them
        needs it, or the forward ends: :meth:`_issue_copies_out`); the record enters the
        copy-out FIFO, whose oldest records are retired while it holds more than the schedule's
        limit and more than one."""
        record.copy_out = _NOT_ISSUED
        copies = self._copies_out
        copies.append(record)
        self._copy_sources.append(source)
        self._copy_hosts.append(host)
        nbytes = record.nbytes
        pending = self._copies_out_bytes = self._copies_out_bytes + nbytes
        if group_ends and (pending >= COPY_GROUP_BYTES or len(copies) >= COPY_GROUP_STORAGES):
            self._issue_copies_out()
        record.source_storage = storage
        step.swapped.append(record)  # prefetched from begin_backward on (its order set there)
        step.bytes_out += nbytes
        record.in_fifo = True
        step.copying_out.append(record)
        step.copying_out_bytes += nbytes
        step.copying_out_count += 1
        limit = self._schedule.max_copying_out_bytes
        if limit is None:
            return
        while step.copying_out_bytes > limit and step.copying_out_count > 1:
            self._retire(step, step.copying_out.popleft())

    def _retire(self, step: _StepState | None, record: StorageRecord) -> None:
        """Take the record out of the copy-out FIFO: compute waits on its copy, the source goes."""
        if record.source_storage is not None:  # else retired already (in the FIFO only with it)
            self._settle_copy_out(step, record)
            record.source_storage = None
            block = record.source_block
            if block.unhold():
                self._free_block(block)

    def _settle_copy_out(self, step: _StepState | None, record: StorageRecord) -> None:
        """The record leaves the copy-out FIFO's count, and compute waits on its copy out (once)."""
        if record.in_fifo:
            record.in_fifo = False
            if step is not None:
                step.copying_out_bytes -= record.nbytes
                step.copying_out_count -= 1
        if not record.copy_out_waited:
            if record.copy_out is _NOT_ISSUED:
                self._issue_copies_out()
            record.copy_out_waited = True
            event = record.copy_out  # _wait_once, inline: the hot path (once per swapped storage)
            if event is not self._compute_waited_on:
                self._compute_waited_on = event
                self.runtime.wait(event)

    def _wait_once(self, event: StreamEvent) -> None:
        """Compute waits on ``event``, unless it is the event compute waited on last (the records
        of a group of copies share one: a second wait would order nothing more)."""
        if event is not self._compute_waited_on:
            self._compute_waited_on = event
            self.runtime.wait(event)

    def _issue_copies_out(self) -> None:
        """Issue the copies out not issued yet as one group on the copy stream, after the compute
        issued so far: one event for them all. A record whose lineage was written in place
        since its save now holds the bytes of that version: its saves no longer match it, as
        plain autograd's would not (:meth:`_unpack` raises).

        The copies record no autograd history: a pack hook runs with grad mode off, but a group
        is also issued outside one (a step aborted inside a group, a forward that ends with one
        open), where copying a source that requires grad into a host view made in a hook is an
        in-place write that autograd refuses."""
        records = self._copies_out
        if not records:
            return
        written = self.runtime.record_compute()
        with torch.no_grad() if torch.is_grad_enabled() else nullcontext():
            done = self.runtime.copy_out(written, self._copy_sources, self._copy_hosts)
        for record in records:
            record.copy_out = done
            root = record.root()
            if root is not None:  # alive: the source held till now is a view of it
                record.version = root._version
        self._copies_out, self._copy_sources, self._copy_hosts = [], [], []
        self._copies_out_bytes = 0

    def _fetch(self, record: StorageRecord) -> None:
        """Make the record's bytes available on the device now (read in backward before its
        prefetch, or by a backward inside the forward)."""
        if self._place(record):
            self._copy_in([record])

    def _place(self, record: StorageRecord) -> bool:
        """Give the record its bytes on the device: where they are if still in the FIFO, else a
        block allocated on the compute stream; ``True`` when they are to be copied in there
        (:meth:`_copy_in`)."""
        step = self._step
        storage = record.source_storage
        if storage is not None:
            # Still in the FIFO: read it where it is. Compute waits on the copy out so that
            # the block may be freed in compute order whenever its last view dies.
            self._settle_copy_out(step, record)
            dense = record.dense  # the tensor saved, typed, or the storage's bytes
            whole = (
                torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
                if dense is None
                else torch.empty(0, dtype=dense[0], device=self.device).set_(storage, 0, dense[1], dense[2])
            )
            record.fetched, record.fetched_ready = whole, None
            record.fetched_block = block = record.source_block
            nbytes = block.nbytes
            counts = block.hold()
            in_window = step is not None and not block.in_prefetch_window and not self._in_forward
            if in_window:
                block.in_prefetch_window = True
        else:
            dense = record.dense
            destination = (
                self.runtime.allocate((record.nbytes,), (1,), torch.uint8)
                if dense is None
                else self.runtime.allocate(dense[1], dense[2], dense[0])
            )
            nbytes = record.nbytes
            counts = True
            in_window = step is not None and not self._in_forward
            record.fetched = destination
            record.fetched_copy = FetchedCopy(
                StorageWeakReference(destination.untyped_storage()),
                nbytes,
                destination.data_ptr() if self._tracks_blocks else 0,
                in_window,
            )
        if counts:
            ledger = self.ledger  # DeviceLedger.acquire, inline: the hot path
            current = ledger.activation_bytes + nbytes
            ledger.activation_bytes = current
            if current > ledger.peak_activation_bytes:
                ledger.peak_activation_bytes = current
        if in_window:
            assert step is not None
            step.window_used += nbytes
        return storage is None

    def _copy_in(self, records: list[StorageRecord]) -> None:
        """Copy the host copies of ``records`` into the blocks :meth:`_place` allocated them, as
        one group on the copy stream after those allocations: one event for them all."""
        allocated = self.runtime.record_compute()
        hosts, destinations = [], []
        for record in records:
            assert record.host_view is not None and record.fetched is not None
            hosts.append(record.host_view)
            destinations.append(record.fetched)
        ready = self.runtime.copy_in(allocated, hosts, destinations)
        nbytes = 0
        for record in records:
            record.fetched_ready = ready
            nbytes += record.nbytes
        step = self._step
        if step is not None:
            step.bytes_in += nbytes

    def _prefetch(self) -> None:
        """Bring back swapped records in reverse order of last save while the window allows,
        those copied in as one group. Stopped by the window, it is not due again before a
        block leaves the window (:attr:`_StepState.window_full`): the unpacks skip it."""
        step = self._step
        if step is None or self._in_forward:
            return
        window = self._schedule.prefetch_window_bytes
        copied: list[StorageRecord] = []
        swapped, next_prefetch = step.swapped, step.next_prefetch
        step.window_full = False
        while next_prefetch >= 0:
            record = swapped[next_prefetch]
            if record.fetched is None and record.pending_unpacks and record.host_buffer is not None:
                used = step.window_used  # _place adds to it
                if used > 0 and used + record.nbytes > window:
                    step.window_full = True  # until a block leaves the window (_leave_device)
                    break
                if self._place(record):
                    copied.append(record)
            next_prefetch -= 1
        step.next_prefetch = next_prefetch
        if copied:
            self._copy_in(copied)

    def _observed_peak(self, route: ReplayRoute | None) -> int | None:
        """The activation peak of the last observed pass, if it was replayed on ``route``
        without departing from its sequence (the passes of the route may then run unobserved);
        ``None`` otherwise."""
        last = self._last_observed
        return last[1] if last is not None and last[0] is route else None

    def _restart_ordinals(self) -> None:
        """The next save is the first of a pass: ordinal 0, on the sequence replayed (if any)."""
        self._calls, self._departed = 0, -1
        self._fast_end = len(self._route) if self._replaying is not None and self._route is not None else 0

    def _open_step(self) -> _StepState:
        self._in_forward = True
        if self._step is None:
            if self._recording is None:
                self.pass_timer.start()
            elif not self.timer.started:
                self.timer.start()
            replayed = len(self._route) if self._replaying is not None and self._route is not None else 0
            self._step = _StepState(replayed)
            self.ledger.start_step(self._static_bytes)
            self.runtime.collect_wait_seconds()
        return self._step


def _is_dense(tensor: torch.Tensor) -> bool:
    """Contiguous or channels-last: no gaps, no overlap, so a copy can be laid out like it."""
    return tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)


def _stale_error() -> StaleSavedTensorError:
    return StaleSavedTensorError(
        "this saved activation belonged to a training step that was aborted (an exception "
        "was raised in it); run the forward pass again before calling backward"
    )


def _pointers_of(model: nn.Module) -> set[int]:
    """Data addresses of the model's parameters and buffers: a cheap first filter (a tensor
    starting there is one of them or a view of one at its start)."""
    tensors = [*model.parameters(), *model.buffers()]
    return {pointer for tensor in tensors if (pointer := tensor.data_ptr()) != 0}


def _storages_of(model: nn.Module) -> set[int]:
    """Storage addresses of the model's parameters and buffers (views of them share these)."""
    tensors = [*model.parameters(), *model.buffers()]
    return {tensor.untyped_storage().data_ptr() for tensor in tensors}
