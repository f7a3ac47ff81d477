"""Saved storages, the device blocks they occupy, and how a saved view is checked and rebuilt.

A :class:`StorageRecord` is one copy of (part of) a device storage, taken the first time a
tensor of one *view lineage* is saved in a step. A later save reuses the record only when
that cannot change a byte: the same lineage (views share a version counter with their base),
the same version as when the copy was taken, and an extent inside the copied one. A tensor
written in place since, or another lineage over the same storage (``unsafe_chunk`` outputs
of a GRU cell's gates, which do not share a version counter), gets a record of its own.

Device memory is counted by :class:`DeviceBlock`, one per saved storage the engine knows
(however many records copy parts of it), counted in the ledger once while anything holds it,
and by :class:`FetchedCopy`, one per copy brought back, counted until its storage dies.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from lightning_accudnn.ops._torch_internals import StorageWeakReference
from lightning_accudnn.ops.runtime import StreamEvent

_ALIGN = 16  # bytes: extents start here so that every element type stays aligned


class DeviceBlock:
    """A saved storage the engine accounts for, counted from its first holder on (the records
    of its parts, the copy-out FIFO, a read where it was saved).

    ``key`` is its address. :meth:`hold` says whether a hold starts its count (the engine then
    counts it in its ledger); :meth:`unhold` whether its last holder let go (the engine then
    frees it). ``held=True`` makes a block with its first holder, counted.

    Example:
        >>> block = DeviceBlock(1234, 64)
        >>> block.hold(), block.hold(), block.counted
        (True, False, True)
        >>> block.unhold(), block.unhold()
        (False, True)
        >>> DeviceBlock(1234, 64, held=True).holders
        1
    """

    __slots__ = ("key", "nbytes", "holders", "counted", "in_prefetch_window")

    def __init__(self, key: int, nbytes: int, held: bool = False) -> None:
        self.key = key
        self.nbytes = nbytes
        self.holders = 1 if held else 0
        self.counted = held
        self.in_prefetch_window = False

    def hold(self) -> bool:
        """One more holder; ``True`` when this hold starts the block's count."""
        self.holders += 1
        if self.counted:
            return False
        self.counted = True
        return True

    def unhold(self) -> bool:
        """One holder fewer; ``True`` when it was the last one (the block is to be freed)."""
        holders = self.holders = self.holders - 1
        return holders == 0


class FetchedCopy(NamedTuple):
    """A record's bytes brought back into a block the engine allocated on the compute stream,
    counted from its allocation until its storage dies (autograd may still read views of it
    after the engine let go): ``storage`` watches it; ``key`` is its address for a runtime
    that tracks blocks (0 otherwise); ``in_prefetch_window`` says whether it counts in the
    step's prefetch window (allocated in backward).

    Example:
        >>> copy = torch.zeros(4)
        >>> fetched = FetchedCopy(StorageWeakReference(copy.untyped_storage()), 16, 0, True)
        >>> fetched.storage.expired(), fetched.nbytes
        (False, 16)
    """

    storage: StorageWeakReference
    nbytes: int
    key: int
    in_prefetch_window: bool


def byte_extent(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor can read: ``[start, end)``.

    Example:
        >>> base = torch.zeros(4, 8)
        >>> byte_extent(base[1:3, 2:4])
        (40, 80)
        >>> byte_extent(base[1:3])
        (32, 96)
    """
    itemsize = tensor.element_size()
    start = int(tensor.storage_offset()) * itemsize
    if tensor.is_contiguous():  # the common case, without a walk over the dimensions
        return start, start + tensor.numel() * itemsize
    if tensor.numel() == 0:
        return start, start
    last = sum(
        (int(size) - 1) * int(stride) for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return start, start + (last + 1) * itemsize


def lineage_root(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose version counter ``tensor`` shares (its view base, or itself)."""
    base = tensor._base
    return base if base is not None else tensor


class StorageRecord:
    """The engine's state for one copy of a saved storage's bytes in one step.

    ``start``/``end`` is the byte extent of the storage this record stands for (copied to
    the host when swapped); ``nbytes`` its length. ``swap`` says whether the schedule swaps it,
    ``swappable`` whether the filter allowed a swap; ``root`` is the lineage root saved (the
    record checks its version), ``source_block`` the device block of the storage, ``ordinal``
    the save that opened it in its step and ``kind`` what it is to the plan.

    Example:
        >>> saved = torch.ones(4)
        >>> block = DeviceBlock(saved.untyped_storage().data_ptr(), 16)
        >>> record = StorageRecord("fc1", 0, 16, 3, True, True, saved, block, 2, 0)
        >>> record.nbytes, record.serves(saved, 0, 16), record.serves(saved, 0, 32)
        (16, True, False)
    """

    __slots__ = (
        "layer",
        "start",
        "end",
        "nbytes",
        "last_save",
        "swap",
        "swappable",
        "read_in_forward",
        "root",
        "version",
        "source_block",
        "host_buffer",
        "source_storage",
        "dense",
        "copy_out",
        "copy_out_waited",
        "in_fifo",
        "fetched",
        "fetched_block",
        "fetched_copy",
        "fetched_ready",
        "host_view",
        "pending_unpacks",
        "released",
        "ordinal",
        "kind",
    )

    swappable: bool  # the filter allowed a swap
    read_in_forward: bool  # unpacked by a backward run inside the forward (double backward)
    host_buffer: torch.Tensor | None
    host_view: torch.Tensor | None  # ``host_buffer``'s first ``nbytes``, typed: the copy
    #: The saved storage, held until the copy out is over (compute waited on its event).
    source_storage: torch.UntypedStorage | None
    #: ``(dtype, shape, stride, 0)`` when the record holds one dense tensor whole (contiguous
    #: or channels-last, its storage from byte 0 to its end): its copies are laid out like
    #: it, and a save of exactly that tensor unpacks to the copy brought back itself, or to
    #: one typed view of the storage where it was saved (no view per save); else ``None``.
    dense: tuple[torch.dtype, torch.Size, tuple[int, ...], int] | None
    copy_out: StreamEvent  # the copy out's event on the copy stream (its group's)
    copy_out_waited: bool  # compute has waited on it: the source may be dropped
    in_fifo: bool  # counted in the engine's copy-out FIFO
    fetched: torch.Tensor | None  # the bytes on the device in backward
    #: Where ``fetched`` lives: the saved storage's block when read where it was saved (still
    #: in the copy-out FIFO, or held there by another record of the storage that is), or a copy
    #: brought back into a block the engine allocated (:class:`FetchedCopy`); the other one is
    #: ``None``.
    fetched_block: DeviceBlock | None
    fetched_copy: FetchedCopy | None
    fetched_ready: StreamEvent | None  # copy-in event compute has not waited on yet
    pending_unpacks: int  # saves through it not unpacked yet
    released: bool  # its device bytes are no longer the engine's: no later save reuses it
    ordinal: int  # of the save that opened it in its step
    kind: int  # what it is to the plan (``layers.SWAPPABLE``, ``SMALL``, ``PINNED``)

    def __init__(
        self,
        layer: str,
        start: int,
        end: int,
        last_save: int,
        swap: bool,
        swappable: bool,
        root: torch.Tensor,
        source_block: DeviceBlock,
        ordinal: int,
        kind: int,
    ) -> None:
        # Positional parameters: a record is made per saved storage, and keyword arguments to a
        # class cost a third more (about 0.7 µs on a slow host).
        self.layer = layer
        self.start = start
        self.end = end
        self.nbytes = end - start
        self.last_save = last_save
        self.swap = swap
        self.swappable = swappable
        self.root = weakref.ref(root)
        self.version = root._version
        self.source_block = source_block
        self.ordinal = ordinal
        self.kind = kind
        # The rest start empty, set from one constant tuple (the hot path: one store each).
        (
            self.read_in_forward,
            self.host_buffer,
            self.host_view,
            self.source_storage,
            self.dense,
            self.copy_out,
            self.copy_out_waited,
            self.in_fifo,
            self.fetched,
            self.fetched_block,
            self.fetched_copy,
            self.fetched_ready,
            self.pending_unpacks,
            self.released,
        ) = (False, None, None, None, None, None, False, False, None, None, None, None, 0, False)

    def serves(self, root: torch.Tensor, start: int, end: int) -> bool:
        """Whether a save of these bytes of ``root`` now would read exactly what this record holds."""
        return (
            not self.released
            and self.root() is root
            and root._version == self.version
            and self.start <= start
            and end <= self.end
        )


def record_extent(
    root: torch.Tensor, tensor: torch.Tensor, storage_nbytes: int, extent: tuple[int, int] | None = None
) -> tuple[int, int]:
    """The extent a new record copies: its lineage root's, widened to hold ``tensor``, aligned.

    ``extent`` is ``byte_extent(tensor)`` when the caller has it already."""
    start, end = byte_extent(tensor) if extent is None else extent
    root_start, root_end = (start, end) if root is tensor else byte_extent(root)
    start = min(start, root_start) // _ALIGN * _ALIGN
    return start, min(max(end, root_end), storage_nbytes)


def modified_in_place_error(
    dtype: torch.dtype, shape: torch.Size, version: int, expected: int
) -> RuntimeError:
    """The error plain autograd raises when a saved tensor was changed in place since it was saved.

    Example:
        >>> str(modified_in_place_error(torch.float32, torch.Size([2]), 1, 0)).split(":")[0]
        'one of the variables needed for gradient computation has been modified by an inplace operation'
    """
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: [{dtype} {list(shape)}] is at version {version}; expected version "
        f"{expected} instead. Hint: enable anomaly detection to find the operation that "
        "failed to compute its gradient, with torch.autograd.set_detect_anomaly(True)."
    )


def saved_view(
    device_bytes: torch.Tensor,
    start: int,
    dtype: torch.dtype,
    shape: torch.Size,
    stride: tuple[int, ...],
    offset: int,
) -> torch.Tensor:
    """The saved view (``dtype``, ``shape``, ``stride``, element ``offset`` into its storage)
    over ``device_bytes``, whose storage holds the saved storage's bytes from byte ``start`` on.

    Example:
        >>> x = torch.arange(6.0).reshape(2, 3)
        >>> copy = x.untyped_storage()[4:]  # the bytes from the second element on
        >>> saved_view(torch.empty(0, dtype=torch.uint8).set_(copy), 4, x.dtype, (3,), (1,), 3)
        tensor([3., 4., 5.])
    """
    view = torch.empty(0, dtype=dtype, device=device_bytes.device)
    return view.set_(device_bytes.untyped_storage(), offset - start // view.element_size(), shape, stride)
