"""The hot front of the engine: the pack and unpack hooks, and the replayed fast path.

Every tensor autograd saves inside :meth:`.OffloadEngine.offload` passes a pack hook here. In
a hooked (profiled) pass it is filtered, attributed to the layer running now and saved through
the engine's records (:class:`SaveRecords`); in a pass replayed by ordinal, what the profiled
pass did at the same ordinal decides (:class:`.ReplayRoute`): a kept storage costs a few list
operations, a storage swapped whole opens its record without the filter, the rest go through
the records. The unpack hook gives autograd its tensors back, checked for in-place changes,
bringing swapped bytes back through :class:`.CopyTraffic`.

The two classes are layers of the engine's one object, above :class:`.CopyTraffic` and below
:class:`.OffloadEngine`: the hooks read the engine's state directly, with no attribute hop
per saved tensor.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

from lightning_accudnn.ops._torch_internals import StorageWeakReference
from lightning_accudnn.ops.errors import StaleSavedTensorError
from lightning_accudnn.ops.layers import (
    FILTERED,
    HELD,
    PINNED,
    REUSED,
    SMALL,
    SWAPPABLE,
    LayerTracker,
    SaveSequence,
)
from lightning_accudnn.ops.recording import note_resave
from lightning_accudnn.ops.replay import KEEP_NEW, LEAVE, RECORD, SWAP_AGAIN, SWAP_WHOLE, ReplayRoute
from lightning_accudnn.ops.runtime import Runtime
from lightning_accudnn.ops.saves import Geometry, KeptSave, RecordSave, StepState, StorageEntry
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.ops.stash import (
    DeviceBlock,
    StorageRecord,
    byte_extent,
    lineage_root,
    modified_in_place_error,
    record_extent,
    saved_view,
)
from lightning_accudnn.ops.timing import LayerTimer, PassTimer, clock_for
from lightning_accudnn.ops.transfers import CopyTraffic
from lightning_accudnn.ops.weight_copies import WeightCopies
from lightning_accudnn.tensor_layout import is_dense

#: The layer a saved tensor is attributed to when, in a pass replayed by ordinal, the graph
#: departed from the profiled sequence (an unknown name: a plan swaps it, the safe side).
CHANGED_GRAPH_LAYER = "(changed graph)"

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


class SaveRecords(CopyTraffic):
    """The saves through the engine's records: the filter, one record per saved view lineage of
    a storage, the handles autograd holds, and the count of the storages kept on the fast path.

    It also holds what the hooks read: the pass's ordinals, the route replayed, the sequence
    recorded, the model's storages the filter leaves out, the layer tracker and timers.

    Example:
        >>> from lightning_accudnn.ops.runtime import make_runtime
        >>> records = SaveRecords(make_runtime(torch.device("cpu")), 2**30, 0, ())
        >>> records.min_swap_bytes, records.step_open
        (0, False)
    """

    def __init__(
        self, runtime: Runtime, host_memory_limit: int, min_swap_bytes: int, exclude: Iterable[str]
    ) -> None:
        super().__init__(runtime, host_memory_limit)
        self.min_swap_bytes = min_swap_bytes
        self.timer = LayerTimer(clock_for(self.device))
        runtime.stalls = self.timer  # waits on copies are left out of the layers' compute times
        self.pass_timer = PassTimer(self.timer.clock)  # passes replayed by ordinal (no layer marks)
        self.tracker = LayerTracker(exclude=tuple(exclude), on_enter=self._entered, on_exit=self._exited)
        self._model_storages: set[int] = set()
        self._model_pointers: set[int] = set()  # the parameters' and buffers' own addresses
        # Autocast's copies of parameters: kept, counted apart, under the layer saving them.
        tracker = self.tracker
        self.weight_copies = WeightCopies(lambda: tracker.current)
        self._recording: SaveSequence | None = None  # hooked pass: the saves, in order
        self._replaying: SaveSequence | None = None  # pass attributed by ordinal (no hooks)
        # ``_replaying`` compiled for the schedule (an empty route before the first replay)
        self._route = ReplayRoute(SaveSequence(), SwapSchedule.keep_everything())
        self._calls = 0  # tensors given to the pack hook in this pass: the ordinal of the next
        self._departed = -1  # replayed pass: the first ordinal off the sequence (graph changed)
        self._fast_end = 0  # replayed pass: ordinals below it may take the fast path (0 once departed)
        self._device_index = -1  # of ``device`` for the filter (-1: the CPU), set by ``offload``
        self._static_bytes = 0

    def _entered(self, layer: str) -> None:
        """A layer's forward starts (a hooked pass): see :meth:`_exited`."""
        if self._meter is not None:
            self._meter.boundary()
        self.timer.enter(layer)

    def _exited(self, layer: str) -> None:
        """A layer's forward ends: the meter lets go of what the model's code no longer holds
        (:meth:`.WorkingMemoryMeter.boundary`), and the layer timer marks it."""
        if self._meter is not None:
            self._meter.boundary()
        self.timer.exit(layer)

    def _open_step(self) -> StepState:
        self._in_forward = True
        if self._step is None:
            if self._recording is None:
                self.pass_timer.start()
            elif not self.timer.started:
                self.timer.start()
            route = self._route if self._replaying is not None else None
            self._step = StepState(None if route is None else route.sequence.sizes)
            self.ledger.start_step(self._static_bytes)
            self.runtime.collect_wait_seconds()
        return self._step

    def _activation_storage(self, tensor: torch.Tensor) -> tuple[torch.UntypedStorage, int, int] | None:
        """The filter: the storage, its address and size of an activation, ``None`` for the rest."""
        if not self._is_plain(tensor):
            return None
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._model_storages or self.weight_copies.recognise(tensor, self._model_storages):
            return None
        return storage, key, storage.nbytes()

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

    def _pack_record(
        self,
        step: StepState,
        ordinal: int,
        tensor: torch.Tensor,
        storage: torch.UntypedStorage,
        key: int,
        storage_nbytes: int,
        layer: str,
        excluded: bool,
    ) -> tuple[RecordSave, StorageRecord, bool]:
        """A save through the records; returns its handle, its record and whether it opened it.

        The handle autograd keeps is a :data:`.RecordSave` (no finalizer)."""
        entry = step.by_storage.get(key)
        if entry is None or entry.storage.expired():
            block = DeviceBlock(key, storage_nbytes)
            entry = StorageEntry(StorageWeakReference(storage), block, ordinal)
            step.by_storage[key] = entry
        root = lineage_root(tensor)
        extent = start, end = byte_extent(tensor)
        for record in entry.records:
            if record.serves(root, start, end):
                # Saved again by a later layer: backward needs it when it reaches that layer.
                record.last_save = ordinal + 1
                handle = self._handle(step, record, tensor)
                if self._recording is not None:
                    if record.swappable:
                        note_resave(step, record, layer)
                    if layer != record.layer and self._meter is not None:  # read by the meter by number
                        step.saved_again_by[handle[3]] = (layer, len(step.layer_saved))
                return handle, record, False
        record = self._new_record(step, entry, root, tensor, storage_nbytes, layer, excluded, extent, ordinal)
        entry.records.append(record)
        step.held_records += 1
        step.records.append(record)
        if record.swap:
            dense = record.start == 0 and record.nbytes == tensor.nbytes and not tensor.storage_offset()
            self._start_copy_out(step, record, storage, tensor, dense=dense and is_dense(tensor))
        else:
            self._hold_found(record.source_block)
        return self._handle(step, record, tensor, record.dense), record, True

    @staticmethod
    def _handle(
        step: StepState,
        record: StorageRecord,
        tensor: torch.Tensor,
        geometry: Geometry | None = None,
    ) -> RecordSave:
        """The handle of a save; ``geometry`` is the tensor's ``(dtype, shape, stride, offset)``
        when the caller has it (a dense record's first save: :attr:`.StorageRecord.dense`)."""
        index = len(step.handle_unpacked)
        step.handle_unpacked.append(0)
        record.pending_unpacks += 1
        if record.swap:
            if geometry is None:
                geometry = (tensor.dtype, tensor.shape, tensor.stride(), int(tensor.storage_offset()))
            return (record, None, tensor._version, index, step, geometry)
        return (record, tensor.detach(), tensor._version, index, step, None)

    def _new_record(
        self,
        step: StepState,
        entry: StorageEntry,
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
        held = self._recording is not None and bool(self._schedule.held_records) and self._held(step, layer)
        allowed = nbytes > 0 and not excluded and not held and _keep_on_device_depth.get() == 0
        swappable = allowed and nbytes >= self.min_swap_bytes
        step.layer_saved[layer] = step.layer_saved.get(layer, 0) + nbytes
        if swappable:
            step.layer_swappable[layer] = step.layer_swappable.get(layer, 0) + nbytes
        elif allowed:
            step.layer_small.setdefault(layer, []).append(nbytes)
        swap = swappable and self._schedule.swaps(layer) and self._host_can_hold(nbytes)
        kind = SWAPPABLE if swappable else SMALL if allowed else HELD if held else PINNED
        block = entry.block
        # layer, extent, last save, swapped, swappable, root, block, opening ordinal, kind
        return StorageRecord(layer, start, end, ordinal + 1, swap, swappable, root, block, ordinal, kind)

    def records_of(self, tensor: torch.Tensor) -> tuple[list[StorageRecord], int]:
        """The records of the step in progress holding ``tensor``'s storage (none where it was
        not saved), and the saves of the pass so far: a record saved again later has a
        :attr:`.StorageRecord.last_save` above that count.

        Example:
            >>> from lightning_accudnn.ops.runtime import make_runtime
            >>> SaveRecords(make_runtime(torch.device("cpu")), 2**30, 0, ()).records_of(torch.ones(2))
            ([], 0)
        """
        step = self._step
        entry = None if step is None else step.by_storage.get(tensor.untyped_storage().data_ptr())
        if entry is None or entry.storage.expired():
            return [], self._calls
        return list(entry.records), self._calls

    def _held(self, step: StepState, layer: str) -> bool:
        """Whether the record ``layer`` opens now in a hooked pass is one the schedule names held
        (:attr:`.SwapSchedule.held_records`)."""
        index = step.layer_records.get(layer, 0)
        step.layer_records[layer] = index + 1
        return (layer, index) in self._schedule.held_records

    def _host_can_hold(self, nbytes: int) -> bool:
        """False only when the schedule keeps what passes the host cap and this would."""
        return not self._schedule.keep_beyond_host_limit or self.pool.can_hold(nbytes)

    def _uncount_kept(self, step: StepState, group: int) -> None:
        """The last pending save of a fast-kept storage was read (or the step ends): out of the count."""
        step.kept_pending[group] = 0
        self.ledger.activation_bytes -= step.kept_sizes[group]
        if self._tracks_blocks:
            self.runtime.release(step.kept_address.pop(group))

    def _release_kept(self, step: StepState) -> None:
        """The step ends (or aborts): fast-kept storages never read are no longer counted."""
        if any(step.kept_pending):
            for group, pending in enumerate(step.kept_pending):
                if pending:
                    self._uncount_kept(step, group)

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

    def _keep_held_storages(self, step: StepState, recording: SaveSequence) -> tuple[set[object], int]:
        """The forward of a hooked pass is over: a swapped storage the engine let go whole that is
        still alive is held by the model's code beyond the forward (the batch). Its swap freed
        nothing, and its copy brought back would sit beside it: its records become :data:`HELD`
        in the pass's sequence and are reported as not swappable, so that the plans made from the
        pass keep it, and so do the passes their schedules run
        (:attr:`.SwapSchedule.held_records`). Returns those storages' blocks and the bytes of
        their records."""
        if self._meter is not None:  # what only the meter holds is no longer alive
            self._meter.boundary()
        blocks: set[object] = set()
        nbytes = 0
        for entry in step.by_storage.values():
            if entry.block.holders or entry.storage.expired():
                continue  # still the engine's (its copy out in flight, or kept), or freed
            for record in entry.records:
                if record.swap and record.kind == SWAPPABLE and not record.read_in_forward:
                    record.kind, record.swappable = HELD, False
                    recording.kinds[record.ordinal] = HELD
                    step.layer_swappable[record.layer] -= record.nbytes
                    step.resaved_from.pop(record, None)  # resaves count swappable bytes only
                    step.resaved_module.pop(record, None)
                    nbytes += record.nbytes
                    blocks.add(entry.block)
        return blocks, nbytes

    # -- filter and records -----------------------------------------------------------


class SaveHooks(SaveRecords):
    """The saved-tensor hooks: the pack paths of a hooked pass and of a replayed one, and unpack.

    Example:
        >>> from lightning_accudnn.ops.runtime import make_runtime
        >>> hooks = SaveHooks(make_runtime(torch.device("cpu")), 2**30, 0, ())
        >>> saved = torch.ones(2)
        >>> hooks._unpack(saved) is saved  # a save the pack hook left to autograd
        True
    """

    def __init__(
        self, runtime: Runtime, host_memory_limit: int, min_swap_bytes: int, exclude: Iterable[str]
    ) -> None:
        super().__init__(runtime, host_memory_limit, min_swap_bytes, exclude)
        self._saved_tensor_hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._unhook_after = -1  # a pass replayed unobserved: the hooks go after this ordinal

    def _pack_recorded(self, tensor: torch.Tensor) -> RecordSave | torch.Tensor:
        """A save in a hooked pass: attributed to the layer running now, and noted in the sequence."""
        ordinal = self._calls
        self._calls = ordinal + 1
        recording = self._recording
        assert recording is not None
        layer, excluded = self.tracker.saving_layer(), self.tracker.excluded
        found = self._activation_storage(tensor)
        if found is None:
            recording.append(layer, excluded, 0, kind=FILTERED)
            return _left_alone(tensor)
        storage, key, storage_nbytes = found
        step = self._open_step()
        packed, record, opened = self._pack_record(
            step, ordinal, tensor, storage, key, storage_nbytes, layer, excluded
        )
        meter = self._meter
        if meter is not None:
            meter.saved(record.layer)
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

    def _pack_replayed(self, tensor: torch.Tensor) -> KeptSave | RecordSave | torch.Tensor:
        """A save in a pass replayed by ordinal; the hot path.

        What the profiled pass did at this ordinal decides (:class:`.ReplayRoute`), checked by
        the tensor's size: a tensor that was no activation goes back to autograd untouched; one
        whose storage the plan keeps costs a few list operations (autograd keeps a
        :data:`.KeptSave`, its storage is counted by the ordinal of
        its first save, with the storage's bytes the profiled pass measured); a storage swapped
        whole opens its record, and is saved again through it, without the filter
        (:meth:`_pack_whole`, :meth:`_pack_again`); the rest go through the full filter and the
        records. A size that differs marks the graph changed:
        from there on every save goes through the filter and the records."""
        ordinal = self._calls
        self._calls = ordinal + 1
        route = self._route
        if ordinal < self._fast_end:
            action = route.actions[ordinal]
            if action == LEAVE:
                return _left_alone(tensor)
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
                        self.ledger.acquire(nbytes)
                        if self._tracks_blocks:
                            address = step.kept_address[ordinal] = tensor.data_ptr()
                            self.runtime.hold(address, nbytes)
                        return (tensor.detach(), tensor._version, ordinal, ordinal, step)
                    group = sequence.groups[ordinal]
                    pending = step.kept_pending[group]
                    if pending:
                        step.kept_pending[group] = pending + 1
                        # Not its op's own output (that would be a write in place of a saved
                        # storage, refused at backward): no history to leave out (see .saves).
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
            return _left_alone(tensor)
        storage, key, storage_nbytes = found
        step = self._open_step()
        return self._pack_record(
            step, ordinal, tensor, storage, key, storage_nbytes, CHANGED_GRAPH_LAYER, False
        )[0]

    def _pack_whole(
        self, tensor: torch.Tensor, ordinal: int, nbytes: int, layer: str, group_ends: bool
    ) -> RecordSave | None:
        """A replayed save that opened the one record of a storage swapped whole
        (:data:`.SWAP_WHOLE`): checked to be that again (a plain dense tensor over its whole
        storage of the profiled size, on the device, no parameter, outside
        :func:`keep_on_device`), it opens that record without the filter, the extent arithmetic
        and the storage's entry (no other record of the storage can come). Its copy out is
        issued with those of the layer's other whole storages, at the last of them
        (``group_ends``: :attr:`.ReplayRoute.group_ends`). ``None`` when the check fails: the
        graph changed."""
        if type(tensor) is not _TENSOR or tensor.layout != _STRIDED or tensor.nbytes != nbytes:
            return None
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if (
            storage.nbytes() != nbytes
            or tensor.storage_offset()
            or not (tensor.is_contiguous() or is_dense(tensor))  # the common case: one call
            or not self._on_device(tensor)
            or key in self._model_storages
            or _keep_on_device_depth.get()
        ):
            return None
        step = self._step
        if step is None or not self._in_forward:
            step = self._open_step()
        # _start_copy_out's dense case, inline: the host buffer first (it may raise: nothing held
        # yet), laid out like the tensor, which is the copy's source itself; then the block held
        # (a runtime that models the allocator may run out of memory there: the buffer goes back).
        buffer = self.pool.acquire(nbytes)
        dtype, shape, stride = tensor.dtype, tensor.shape, tensor.stride()
        host = self.pool.typed_view(buffer, dtype, shape, stride)
        block = DeviceBlock(key, nbytes, True)  # held: _hold_found, inline (a new block, counted now)
        if self._tracks_blocks:
            try:
                self.runtime.hold(key, nbytes)
            except BaseException:
                self.pool.release(buffer)
                raise
        self.ledger.acquire(nbytes)
        base = tensor._base  # lineage_root, inline: the hot path
        root = tensor if base is None else base
        # layer, extent, last save, swapped, swappable, root, block, opening ordinal, kind
        record = StorageRecord(layer, 0, nbytes, ordinal + 1, True, True, root, block, ordinal, SWAPPABLE)
        record.host_buffer = buffer
        record.host_view = host
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

    def _pack_again(self, tensor: torch.Tensor, ordinal: int, opened_at: int) -> RecordSave | None:
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

    def _unpack(self, packed: KeptSave | RecordSave | torch.Tensor) -> torch.Tensor:
        """Give autograd back a save: the tensor itself (no activation), a fast-kept save checked
        (a :data:`.KeptSave`, 5 fields) or a save through the records (a :data:`.RecordSave`, 6)."""
        if not isinstance(packed, tuple):
            return packed
        if len(packed) == 5:
            # A fast-kept save: checked for in-place changes, uncounted at its storage's last read.
            tensor, version, group, ordinal, step = packed
            if step is self._step:
                if self._in_forward:
                    step.read_in_forward.add(ordinal)  # a backward inside the forward: needed later
                elif not step.unpacked[ordinal]:
                    step.unpacked[ordinal] = 1
                    pending = step.kept_pending[group] - 1
                    if pending:
                        step.kept_pending[group] = pending
                    else:
                        self._uncount_kept(step, group)
                if self._lingering:
                    self._reap()
                if step.next_prefetch >= 0 and not step.window_full:
                    self._prefetch()
            elif step.aborted:
                raise _stale_error()
            if tensor._version != version:
                raise modified_in_place_error(tensor.dtype, tensor.shape, tensor._version, version)
            return tensor
        # A save through the records, its handle's fields unpacked at once (the hot path).
        record, kept, version, number, step, geometry = packed
        if step.aborted:
            raise _stale_error()
        meter = self._meter
        if meter is not None and not step.handle_unpacked[number]:  # before the copies it lets go are reaped
            meter.reaching(record.layer, self.ledger.current_bytes, step.saved_again_by.get(number))
        if self._lingering:
            self._reap()
        current = self._step
        if current is not None and current.next_prefetch >= 0 and not current.window_full:
            self._prefetch(record)
        if kept is not None:
            if kept._version != version:
                raise modified_in_place_error(kept.dtype, kept.shape, kept._version, version)
            tensor = kept
        else:  # a swapped record's save: its handle has the geometry (asserted where read)
            if version != record.version:  # the copy holds a later version (see _issue_copies_out)
                assert geometry is not None
                raise modified_in_place_error(geometry[0], geometry[1], record.version, version)
            root = record.root()
            if root is not None and root._version != version:  # None: the lineage is gone, unchecked
                assert geometry is not None
                raise modified_in_place_error(geometry[0], geometry[1], root._version, version)
        if self._in_forward and not record.read_in_forward:
            self._mark_read_in_forward(record)
        if kept is None:
            fetched = record.fetched
            if fetched is None:
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
        if not step.handle_unpacked[number]:
            step.handle_unpacked[number] = 1
            record.pending_unpacks -= 1
            if meter is not None:
                meter.read(
                    record.layer,
                    self.ledger.current_bytes,
                    step.saved_again_by.get(number),
                    None if kept is not None else record.fetched,
                )
                if self._lingering:  # the copies the meter let go of, dead now: off the count
                    self._reap()
        if record.pending_unpacks == 0 and not record.read_in_forward and not self._in_forward:
            self._release_device(step if step is self._step else None, record)
        return tensor

    def _unhook(self) -> None:
        """Remove the saved-tensor hooks of the pass, if still there."""
        hooks, self._saved_tensor_hooks = self._saved_tensor_hooks, None
        if hooks is not None:
            hooks.__exit__(None, None, None)

    def _stop_observing(self) -> None:
        """A pass replayed unobserved saved the last tensor that its route records: the hooks
        go (this runs inside the pack hook, where they are the innermost), and the saves after
        it stay with autograd unseen. The step reports them all, as an unobserved one does."""
        assert self._step is not None
        self._unhook()
        self._calls = len(self._route)
        self._step.observed = False


#: Module constants for the hot path's checks (one load each, no attribute lookup).
_TENSOR = torch.Tensor
_STRIDED = torch.strided


def _left_alone(tensor: torch.Tensor) -> torch.Tensor:
    """A save that is no activation (a parameter, a tensor on another device...), as its handle:
    the tensor itself, or, when autograd made it, an alias without that history (a save of an
    op's own output must not hold the op's node: see :mod:`.saves`)."""
    return tensor if tensor.grad_fn is None else tensor.detach()


def _stale_error() -> StaleSavedTensorError:
    return StaleSavedTensorError(
        "this saved activation belonged to a training step that was aborted (an exception "
        "was raised in it); run the forward pass again before calling backward"
    )
