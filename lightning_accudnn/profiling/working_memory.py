"""What a traced step holds at once besides the model's state and its saved activations.

A training step allocates more than autograd saves: the outputs of ops that nothing saves
(freed once the next op has read them), the loss and its gradient, and in backward the
gradients of the activations. The planner's ledger counts neither; a budget must hold them
too. :class:`StorageLog` watches every storage the traced step's kernels create, in order, and
when each is freed (a weak reference to the storage: fake tensors have storages, without
data, that live and die as real ones would), so that :meth:`StorageLog.peak_bytes` gives the
most the step held at once in storages that are none of those left out: the saved
activations (the trace keeps them alive, as autograd does until their backward) and the
parameters' gradients (model state). :meth:`StorageLog.alive_bytes` gives the bytes alive after
each event, which :mod:`.traced_ledger` reads as the allocator's count to charge working memory
to the planner's levels.

Example:
    >>> import torch
    >>> log = StorageLog()
    >>> a, b = torch.ones(256), torch.ones(512)
    >>> log.created([a, b]); del a
    >>> log.created([torch.ones(128)])
    >>> log.peak_bytes(), log.peak_bytes(leave_out={log.key(b)})
    (3072, 1024)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Iterable
from functools import partial

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["StorageLog"]


class StorageLog:
    """Storages created and freed during a traced step, in order (see the module docstring).

    A storage is known by its serial number (:meth:`key`), not its address: the address of a
    freed storage may be reused by a later one, and a serial never is. Storages the step's
    kernels did not create (parameters, the batch) get a serial too, but no bytes.

    Example:
        >>> log = StorageLog()
        >>> weight = torch.ones(64)  # not created by the step: a key, no bytes
        >>> out = weight * 2
        >>> log.created([out, out[:8]])  # a view is its base's storage
        >>> log.key(weight) != log.key(out), log.key(out[:8]) == log.key(out), log.peak_bytes()
        (True, True, 256)
    """

    def __init__(self, on_change: Callable[[int], None] | None = None, *, block_bytes: int = 1) -> None:
        #: Each storage is counted as an allocator counts it that rounds its size up to a
        #: multiple of ``block_bytes`` (CUDA's caching allocator: 512).
        self.block_bytes = block_bytes
        #: Told of every change of the bytes counted: ``+bytes`` when a storage is counted,
        #: ``-bytes`` when it is freed (a running count, for a log read while it grows).
        self.on_change = on_change
        self._events: list[tuple[int, int]] = []  # (serial, +bytes when created, -bytes when freed)
        self._live: dict[int, int] = {}  # address -> serial of the storage living there
        self._refs: list[weakref.ref[torch.UntypedStorage]] = []  # per serial, a weak reference
        self._counted: dict[int, int] = {}  # serial -> its bytes, while alive and counted

    @property
    def position(self) -> int:
        """How many events were logged so far (an index into :meth:`alive_bytes`)."""
        return len(self._events)

    def key(self, tensor: torch.Tensor) -> int | None:
        """The serial of ``tensor``'s storage (alive now), ``None`` for a tensor with no single
        storage (sparse, nested)."""
        return self._serial(tensor, counted=False)

    def created(self, tensors: Iterable[torch.Tensor]) -> None:
        """Note the storages of ``tensors`` not seen alive before (a view's is its base's)."""
        for tensor in tensors:
            self._serial(tensor, counted=True)

    def held(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage from now on, if it is not counted yet: one the step did not
        create but holds (the batch, a tensor the model keeps outside its parameters).

        Example:
            >>> log = StorageLog()
            >>> batch = torch.ones(16)
            >>> log.key(batch) is not None, log.peak_bytes()  # known, no bytes
            (True, 0)
            >>> log.held(batch); log.held(batch)
            >>> log.peak_bytes()
            64
        """
        serial = self._serial(tensor, counted=False)
        if serial is not None and serial not in self._counted:
            nbytes = self._rounded(tensor.untyped_storage().nbytes())
            if nbytes:
                self._counted[serial] = nbytes
                self._event(serial, nbytes)

    def _serial(self, tensor: torch.Tensor, *, counted: bool) -> int | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        address = int(StorageWeakRef(storage).cdata)  # type: ignore[no-untyped-call]
        serial = self._live.get(address)
        if serial is not None:
            return serial
        serial = self._live[address] = len(self._refs)
        nbytes = self._rounded(storage.nbytes()) if counted else 0
        if nbytes:
            self._counted[serial] = nbytes
            self._event(serial, nbytes)
        self._refs.append(weakref.ref(storage, partial(self._freed, address, serial)))
        return serial

    def _rounded(self, nbytes: int) -> int:
        return -(-nbytes // self.block_bytes) * self.block_bytes

    def _freed(self, address: int, serial: int, _: object) -> None:
        if self._live.get(address) == serial:
            del self._live[address]
        nbytes = self._counted.pop(serial, 0)
        if nbytes:
            self._event(serial, -nbytes)

    def _event(self, serial: int, change: int) -> None:
        self._events.append((serial, change))
        if self.on_change is not None:
            self.on_change(change)

    def peak_bytes(self, leave_out: Collection[int] = ()) -> int:
        """The most bytes alive at once, the storages whose serials are in ``leave_out`` left out."""
        return max(self.alive_bytes(leave_out))

    def alive_bytes(self, leave_out: Collection[int] = ()) -> list[int]:
        """The bytes alive before the first event and after each (``position + 1`` entries), the
        storages whose serials are in ``leave_out`` left out.

        Example:
            >>> log = StorageLog()
            >>> a = torch.ones(4); log.created([a]); del a
            >>> log.alive_bytes()
            [0, 16, 0]
        """
        alive = 0
        counts = [0]
        for serial, change in self._events:
            if serial not in leave_out:
                alive += change
            counts.append(alive)
        return counts
