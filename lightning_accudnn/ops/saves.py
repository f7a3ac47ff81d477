"""The bookkeeping of one step, and the handles autograd holds for the saves the engine took.

A pack hook returns what autograd keeps until the unpack hook gets it back: the tensor itself
(no activation), a :data:`KeptSave` (a save the plan keeps, taken on the fast path of a pass
replayed by ordinal) or a :data:`RecordSave` (a save through the engine's records). A handle is
made once per saved tensor, so it is a plain tuple, named only in its type: CPython builds and
unpacks an exact tuple with specialised bytecodes, which a named tuple (a subclass) does not
get. The unpack hook tells the two apart by their length (5 and 6) and unpacks every field at
once, by name. Both refer to their :class:`StepState`, which therefore lives as long as the graph
does.

A handle holds a kept tensor saved first in its storage as an alias without autograd history
(``tensor.detach()``): the same storage and version counter, no ``grad_fn``. An op that saves
its own output would otherwise hold, through the handle, a tensor whose ``grad_fn`` is that op's
node: a reference cycle through autograd's C++ graph that the garbage collector cannot see, so
that a graph dropped without a backward (a failed step, a skipped batch) would never be freed.
Autograd puts the history back when it unpacks the save. A later save of a storage already
saved holds the tensor itself (an op's own output there would be a write in place into a saved
storage, which the backward refuses), sparing the alias on the fast path.

Example:
    >>> saved = torch.ones(2)
    >>> handle: KeptSave = (saved, saved._version, 0, 1, StepState([8, 8]))
    >>> tensor, version, group, ordinal, step = handle
    >>> tensor is saved, group, ordinal, len(handle)
    (True, 0, 1, 5)
"""

from __future__ import annotations

from collections import deque
from typing import TypeAlias

import torch

from lightning_accudnn.ops._torch_internals import StorageWeakReference
from lightning_accudnn.ops.stash import DeviceBlock, StorageRecord

#: A view's ``(dtype, shape, stride, element offset)``: what a save of a swapped record is rebuilt from.
Geometry = tuple[torch.dtype, torch.Size, tuple[int, ...], int]


class StorageEntry:
    """One device storage saved in the step: its block, and the records copying parts of it.

    Example:
        >>> saved = torch.zeros(4)
        >>> storage = saved.untyped_storage()
        >>> entry = StorageEntry(StorageWeakReference(storage), DeviceBlock(storage.data_ptr(), 16), 3)
        >>> entry.first_save, entry.records
        (3, [])
    """

    __slots__ = ("storage", "block", "records", "first_save")

    def __init__(self, storage: StorageWeakReference, block: DeviceBlock, first_save: int) -> None:
        self.storage = storage
        self.block = block
        self.records: list[StorageRecord] = []
        self.first_save = first_save  # the ordinal of its first save in the step


class StepState:
    """Bookkeeping of the step in progress.

    Saves kept on the fast path of a replayed pass have no record: their storages are
    counted here by *group*, the ordinal of the storage's first save, in lists indexed by
    ordinal (``kept_pending[group]`` saves not unpacked yet; the bytes counted are the
    profiled pass's, ``kept_sizes[group]``; ``kept_address`` only for a runtime that tracks
    blocks), and ``unpacked`` marks the ordinals unpacked once in backward (later unpacks, a
    retained graph's, count nothing). Saves through the records are numbered in the step;
    ``handle_unpacked`` marks those unpacked once.

    Autograd's handles to the step's saves refer to this object, so it lives as long as
    the graph (or the engine) does: when it dies, the host buffers of its swapped records go
    back to the pool (see the engine's copy traffic), one finalizer per step, not per tensor.

    Example:
        >>> step = StepState([64, 0, 32])
        >>> step.kept_pending, step.swapped, step.next_prefetch
        ([0, 0, 0], [], -1)
    """

    def __init__(self, kept_sizes: list[int] | None = None) -> None:
        replayed_saves = 0 if kept_sizes is None else len(kept_sizes)
        self.by_storage: dict[int, StorageEntry] = {}
        self.kept_pending = [0] * replayed_saves
        self.kept_sizes: list[int] = [] if kept_sizes is None else kept_sizes  # the profiled pass's: shared
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
        self.layer_records: dict[str, int] = {}  # hooked pass naming held records: records opened per layer
        # Hooked pass: per record saved again by another layer, the saving layer (by its index in
        # ``layer_saved``) from whose backward on the record is needed: the last re-save's.
        self.resaved_from: dict[StorageRecord, int] = {}
        # Of those, the ones whose last re-save was by a layer that saved nothing of its own:
        # that layer (``LayerProfile.resaved_by_module``).
        self.resaved_module: dict[StorageRecord, str] = {}
        # Hooked pass: per save (by number) of a storage another layer saved first, the layer
        # saving it again and the index in ``layer_saved`` of the next layer to save first then
        # (its position, if it saves nothing of its own): what the working-memory meter reads by.
        self.saved_again_by: dict[int, tuple[str, int]] = {}


#: What autograd holds for a save kept on the fast path of a replayed pass:
#: ``(tensor, version, group, ordinal, step)``: the tensor (an alias without history at the first
#: save of its storage), its version when saved, its storage's
#: *group* (the ordinal of the storage's first save), its own ordinal and its step.
KeptSave: TypeAlias = tuple[torch.Tensor, int, int, int, StepState]

#: What autograd holds for a save through the engine's records:
#: ``(record, tensor, version, number, step, geometry)``: the record, the tensor (an alias without
#: history; ``None`` when the record is swapped: the bytes come back from its copy), the tensor's
#: version when saved,
#: the save's number in the step (its index in :attr:`StepState.handle_unpacked`), the step, and
#: for a swapped record the tensor's :data:`Geometry` (the record's
#: :attr:`.StorageRecord.dense` itself for the save of a dense record's tensor), else ``None``.
RecordSave: TypeAlias = tuple[StorageRecord, torch.Tensor | None, int, int, StepState, Geometry | None]
