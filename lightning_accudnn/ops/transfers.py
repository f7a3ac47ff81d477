"""The copies of swapped records and the device bytes of the saves: the copy-out FIFO,
prefetching, and release in stream order.

A swapped record's copy out joins a *group* of copies issued together on the copy stream
(one event for them all); its device bytes stay in the step's in-flight FIFO and are dropped,
oldest first, once the compute stream waited on their copy. In backward the records come back
in reverse order of their last save, within the schedule's prefetch window, into memory
allocated on the compute stream. The ledger and the runtime follow every block the engine
holds; nothing polls or synchronizes the device.

:class:`CopyTraffic` is the lowest layer of the engine's object (see :mod:`.engine`): the hot
path calls into it on the same object, at the cost of a method call, never an attribute hop.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext

import torch

from lightning_accudnn.ops._torch_internals import StorageWeakReference
from lightning_accudnn.ops.gradient_arrivals import GradientArrivals
from lightning_accudnn.ops.layers import HELD
from lightning_accudnn.ops.ledger import DeviceLedger
from lightning_accudnn.ops.pool import HostBufferPool
from lightning_accudnn.ops.runtime import Runtime, StreamEvent
from lightning_accudnn.ops.saves import StepState
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.ops.stash import DeviceBlock, FetchedCopy, StorageRecord
from lightning_accudnn.ops.working_memory import WorkingMemoryMeter

#: :attr:`.StorageRecord.copy_out` of a record whose copy out waits for the rest of its group.
NOT_ISSUED: object = object()
#: :attr:`.StorageRecord.copy_out` of a record copied with compute ordered after the copy
#: (:meth:`.Runtime.copy_out_now`): there is no event to wait on.
COPIED_IN_ORDER: object = object()
_NOTHING_WAITED: object = object()  # the compute stream has waited on no event of this engine yet

#: A group of copies out is issued at the end of a layer once it holds this many bytes or this
#: many storages (or when a wait needs one of them, or the forward ends): a group of small
#: storages spans layers, so that its event, its waits and its stream switches are shared.
COPY_GROUP_BYTES = 4 * 2**20
COPY_GROUP_STORAGES = 16


class CopyTraffic:
    """The engine's copies and device bytes: the FIFO, prefetching, release; one engine's state.

    The step in progress (``_step``, while ``_in_forward`` or in its backward) and the
    schedule in force are set by the layers above (:class:`.OffloadEngine`); this one owns the
    group of copies out not issued yet, the copies brought back that outlive their record
    (``_lingering``), the event compute waited on last, and the watches that give a dead
    step's host buffers back to the pool.

    Example:
        >>> from lightning_accudnn.ops.runtime import make_runtime
        >>> traffic = CopyTraffic(make_runtime(torch.device("cpu")), host_memory_limit=2**30)
        >>> traffic.ledger.current_bytes, traffic.step_open
        (0, False)
    """

    def __init__(self, runtime: Runtime, host_memory_limit: int) -> None:
        self.runtime: Runtime = runtime
        self._tracks_blocks = runtime.tracks_blocks
        self.device = runtime.device
        self.pool = HostBufferPool(
            pin_memory=runtime.pin_memory, capacity_bytes=host_memory_limit, allocate=runtime.allocate_host
        )
        self.ledger = DeviceLedger()
        self._schedule = SwapSchedule.keep_everything()
        self._step: StepState | None = None
        self._in_forward = False
        self._meter: WorkingMemoryMeter | None = None  # a hooked pass measuring its working memory
        self._arrivals: GradientArrivals | None = None  # and counting the gradients it makes
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
        self._watches: set[weakref.ref[StepState]] = set()  # steps whose host buffers are still out

    @property
    def step_open(self) -> bool:
        """Whether a step is open (something was saved since the last end or abort)."""
        return self._step is not None

    def _hold_found(self, block: DeviceBlock) -> None:
        """Hold a saved storage; the ledger counts it, and the runtime learns of it, from its
        first holder on."""
        if block.hold():
            if self._tracks_blocks:
                self.runtime.hold(block.key, block.nbytes)
            self.ledger.acquire(block.nbytes)

    def _reap(self) -> None:
        """Free the lingering copies whose storage has died (after the backward op that read
        it): it runs ahead of every prefetch in backward, and the step's end frees the rest.
        Its callers call it only while some linger (the hot path: one test, theirs)."""
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
        self._leave_device(block.nbytes, block.key, block.in_prefetch_window, False)
        block.in_prefetch_window = False

    def _leave_device(
        self, nbytes: int, key: int, in_prefetch_window: bool, brought_back: bool = True
    ) -> None:
        """``nbytes`` at ``key`` leave the count (and the runtime's blocks), in compute order: a
        saved storage the engine no longer needs (not ``brought_back``: left on the device by
        the copy-out FIFO when the forward ended, if in the window), or a copy brought back
        whose storage died or whose step ended."""
        self.ledger.activation_bytes -= nbytes
        if self._tracks_blocks:
            self.runtime.release(key)
        # A prefetched block leaves the window when its last device reference dies (after
        # the backward op that used it), not when it is handed over: the window bounds memory.
        if in_prefetch_window:
            step = self._step
            if step is not None:
                step.window_used -= nbytes
                step.window_full = False
                # A copy brought back is the planner's window content; a storage the FIFO left
                # on the device is its layer's saves, which its level counts until it is done.
                if self._meter is not None and brought_back:
                    self._meter.window_freed(nbytes)

    def _release_device(self, step: StepState | None, record: StorageRecord) -> None:
        """The record's device bytes are no longer needed (read for the last time, or the step
        ends): they leave the count in compute order. A swapped record keeps its host copy
        (a retained graph may read it again) until its step dies (:meth:`_watch`)."""
        if record.swap:
            if record.source_storage is not None:
                self._retire(step, record)
            if self._meter is not None and record.kind == HELD and not record.released:
                copy = record.fetched_copy
                self._meter.held_read(record.nbytes, None if copy is None else copy.storage)
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

    def _release_devices(self, step: StepState) -> None:
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

    def _watch(self, step: StepState) -> None:
        """Give the host buffers of the step's swapped records back to the pool when the step
        dies: when the engine has closed it and autograd has freed every handle to its saves
        (after backward, or when a graph is dropped without one)."""
        step.watched = True
        records = step.swapped
        watches = self._watches

        def died(reference: weakref.ref[StepState]) -> None:
            watches.discard(reference)
            self._release_hosts(records)

        watches.add(weakref.ref(step, died))

    # -- copies ---------------------------------------------------------------------------

    def _start_copy_out(
        self,
        step: StepState,
        record: StorageRecord,
        storage: torch.UntypedStorage,
        tensor: torch.Tensor,
        *,
        dense: bool,
    ) -> None:
        """Copy the record's bytes out: from ``tensor`` itself, typed, when ``dense`` (the tensor
        is the record whole, contiguous or channels-last: :attr:`.StorageRecord.dense`), else
        from a byte view of ``storage`` (:meth:`.SaveHooks._pack_whole` does the dense case inline)."""
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
        try:
            self._hold_found(record.source_block)
        except BaseException:  # a runtime that models the allocator ran out of memory: the buffer goes back
            record.host_buffer = record.host_view = None
            self.pool.release(buffer)
            raise
        self._enqueue_copy_out(step, record, storage, source, host, True)

    def _enqueue_copy_out(
        self,
        step: StepState,
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
        record.copy_out = NOT_ISSUED
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

    def _retire(self, step: StepState | None, record: StorageRecord) -> None:
        """Take the record out of the copy-out FIFO: compute waits on its copy, the source goes."""
        storage = record.source_storage
        if storage is not None:  # else retired already (in the FIFO only with it)
            self._settle_copy_out(step, record)
            record.source_storage = None
            block = record.source_block
            if block.unhold():
                self._free_block(block)
                meter = self._meter
                if meter is not None and self._in_forward:  # the model's code may still hold it
                    reference = StorageWeakReference(storage)
                    meter.retired(block.nbytes, reference, block, record.layer)
                    meter.hold(reference, storage)

    def _settle_copy_out(self, step: StepState | None, record: StorageRecord) -> None:
        """The record leaves the copy-out FIFO's count, and compute waits on its copy out (once)."""
        if record.in_fifo:
            record.in_fifo = False
            if step is not None:
                step.copying_out_bytes -= record.nbytes
                step.copying_out_count -= 1
        if not record.copy_out_waited:
            if record.copy_out is NOT_ISSUED:  # compute would wait on the group at once
                self._copy_out_now()
                return
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
        if not self._copies_out:
            return
        written = self.runtime.record_compute()
        with torch.no_grad() if torch.is_grad_enabled() else nullcontext():
            done = self.runtime.copy_out(written, self._copy_sources, self._copy_hosts)
        self._close_copy_group(done, waited=False)

    def _copy_out_now(self) -> None:
        """Copy the group not issued yet with compute ordered after it (a retirement needs one
        of its sources gone now, so compute would wait on the group as soon as it was issued):
        :meth:`.Runtime.copy_out_now`, no event for the records to wait on."""
        with torch.no_grad() if torch.is_grad_enabled() else nullcontext():
            self.runtime.copy_out_now(self._copy_sources, self._copy_hosts)
        self._close_copy_group(COPIED_IN_ORDER, waited=True)

    def _close_copy_group(self, done: StreamEvent, waited: bool) -> None:
        """The group of copies out is issued: each record gets its event (``done``), whether
        compute is ordered after it already (``waited``) and the version its lineage has now,
        and the next group starts empty."""
        for record in self._copies_out:
            record.copy_out = done
            record.copy_out_waited = waited
            root = record.root()
            if root is not None:  # alive: the source held till now is a view of it
                record.version = root._version
        self._copies_out, self._copy_sources, self._copy_hosts = [], [], []
        self._copies_out_bytes = 0

    def _fetch(self, record: StorageRecord) -> None:
        """Make the record's bytes available on the device now (read in backward before its
        prefetch, or by a backward inside the forward)."""
        if self._place(record):
            self._copy_in([record], now=True)

    def _place(self, record: StorageRecord) -> bool:
        """Give the record its bytes on the device: where they are if still in the FIFO, else a
        block allocated on the compute stream; ``True`` when they are to be copied in there
        (:meth:`_copy_in`)."""
        step = self._step
        storage = record.source_storage
        if storage is None and record.source_block.holders:
            storage = self._storage_still_held(step, record)
        if storage is not None:
            # Still in the FIFO (or its storage still held there by another record of it): read
            # it where it is. Compute waits on the copy out so that the block may be freed in
            # compute order whenever its last view dies.
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
            meter = self._meter
            if meter is not None:
                meter.allocating(self.ledger.current_bytes)
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
            self.ledger.acquire(nbytes)
        if in_window:
            assert step is not None
            step.window_used += nbytes
        return storage is None

    @staticmethod
    def _storage_still_held(step: StepState | None, record: StorageRecord) -> torch.UntypedStorage | None:
        """The storage of a record retired from the copy-out FIFO whose block another record of
        the same storage still holds on the device (views of one output saved as overlapping
        extents: retiring the older let go of nothing): that record's, so that this one is read
        there rather than brought back beside it. ``None`` when no record holds it now."""
        entry = None if step is None else step.by_storage.get(record.source_block.key)
        if entry is None:
            return None
        for other in entry.records:
            if other.source_block is record.source_block and other.source_storage is not None:
                return other.source_storage
        return None

    def _copy_in(self, records: list[StorageRecord], now: bool) -> None:
        """Copy the host copies of ``records`` into the blocks :meth:`_place` allocated them, as
        one group on the copy stream after those allocations: one event for them all. ``now``:
        compute reads one of them at once, so it would wait on the group as soon as it was
        issued; :meth:`.Runtime.copy_in_now` orders compute after it, with no event to wait on."""
        hosts, destinations = [], []
        for record in records:
            assert record.host_view is not None and record.fetched is not None
            hosts.append(record.host_view)
            destinations.append(record.fetched)
        ready: StreamEvent | None
        if now:
            self.runtime.copy_in_now(hosts, destinations)
            ready = None
        else:
            ready = self.runtime.copy_in(self.runtime.record_compute(), hosts, destinations)
        nbytes = 0
        for record in records:
            record.fetched_ready = ready
            nbytes += record.nbytes
        step = self._step
        if step is not None:
            step.bytes_in += nbytes

    def _prefetch(self, needed: StorageRecord | None = None) -> None:
        """Bring back swapped records in reverse order of last save while the window allows,
        those copied in as one group (copied now, :meth:`_copy_in`, when it holds ``needed``:
        the record an unpack reads next). Stopped by the window, it is not due again before a
        block leaves the window (:attr:`StepState.window_full`): the unpacks skip it."""
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
            self._copy_in(copied, needed is not None and needed in copied)

    def _release_lingering(self) -> None:
        """The step is over: copies still referenced elsewhere are no longer the engine's."""
        for copy in self._lingering:
            self._leave_device(copy.nbytes, copy.key, copy.in_prefetch_window)
        self._lingering = []
