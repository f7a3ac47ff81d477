"""One saved storage and the handles autograd holds to it.

A :class:`StorageRecord` is made the first time a storage is saved in a step; every later
save of the same storage (a conv output saved by BatchNorm and by the next op, or two
views of it) gets another :class:`SavedTensor` handle to the same record, so the bytes
move once. A record's device copy is "held" by named owners (the copy-out source, a
fetched copy, each view handed to autograd); the ledger counts its bytes while any holds.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lightning_accudnn.ops.transfer import Transfer


@dataclass(eq=False)
class StorageRecord:
    """The engine's state for one saved storage in one step."""

    layer: str
    nbytes: int
    last_save: int
    swap: bool
    on_resident_change: Callable[[StorageRecord, int], None]
    on_last_handle: Callable[[StorageRecord], None]
    host_buffer: torch.Tensor | None = None
    copy_out_source: torch.Tensor | None = None
    copy_out: Transfer | None = None
    fetched: torch.Tensor | None = None
    fetched_transfer: Transfer | None = None
    in_prefetch_window: bool = False
    live_handles: int = 0
    pending_unpacks: int = 0
    released: bool = False
    aborted: bool = False
    _holders: int = field(default=0, repr=False)

    def hold(self) -> None:
        """One more owner keeps the device copy alive."""
        self._holders += 1
        if self._holders == 1:
            self.on_resident_change(self, self.nbytes)

    def unhold(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            self.on_resident_change(self, -self.nbytes)

    def hold_view(self, view: torch.Tensor) -> None:
        """Keep the device copy counted for as long as ``view`` lives."""
        self.hold()
        weakref.finalize(view, self.unhold)

    @property
    def resident(self) -> bool:
        return self._holders > 0

    def host_bytes(self) -> torch.Tensor:
        assert self.host_buffer is not None
        return self.host_buffer[: self.nbytes]


class SavedTensor:
    """What autograd keeps for one saved tensor: the record and how to rebuild the view.

    A kept tensor is held as it is and handed back unchanged; a swapped one keeps only
    its dtype, shape, strides and offset into the storage.
    """

    __slots__ = ("record", "tensor", "dtype", "shape", "stride", "offset", "unpacked", "__weakref__")

    def __init__(self, record: StorageRecord, tensor: torch.Tensor) -> None:
        self.record = record
        self.unpacked = False
        record.live_handles += 1
        record.pending_unpacks += 1
        if record.swap:
            self.tensor = None
            self.dtype, self.shape = tensor.dtype, tensor.shape
            self.stride, self.offset = tensor.stride(), tensor.storage_offset()
        else:
            self.tensor = tensor

    def rebuild(self, device_bytes: torch.Tensor) -> torch.Tensor:
        """The saved view, over ``device_bytes`` (the whole storage, brought back)."""
        view = torch.empty(0, dtype=self.dtype, device=device_bytes.device)
        return view.set_(device_bytes.untyped_storage(), self.offset, self.shape, self.stride)

    def __del__(self) -> None:
        record = self.record
        if not self.unpacked:
            record.pending_unpacks -= 1
        record.live_handles -= 1
        if record.live_handles == 0:
            record.on_last_handle(record)
