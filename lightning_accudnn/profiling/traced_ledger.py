"""The engine's ledger as a traced step counts it, and the working memory at each of its levels.

A training session measures what a step holds beyond the planner's levels by reading the
device allocator's peak at every change of the engine's ledger (a meter such as
:class:`lightning_accudnn.ops.working_memory.WorkingMemoryMeter`, whose docstring gives the
levels). A traced step has no allocator, but its :class:`~.working_memory.StorageLog` counts
the same bytes: every storage the step's kernels create, from its creation until it is freed.
:class:`TracedLedger` keeps the ledger the engine would keep beside it, model state left out (it
is constant; the parameters' gradients, model state, are either left out of the log's count too,
or, for a step that sets them to ``None``, counted by the ledger from the start and by the log from
their creation in backward, so that a level before a gradient exists holds less than it counts):

* a saved storage counts from its first save (deduplicated by storage, as the engine does);
* in backward it is let go when autograd has read each of its saves once (the engine lets a
  storage go at its last unpack); one never read stays until the step ends.

After the step, :meth:`TracedLedger.working_memory` replays both logs, in the order they were
written, through a meter, which reads the log's peak between two changes of the ledger as the
allocator's, and is told of each save and of each save's first read by the layer that saved its
storage first, as the engine tells it, so that the working memory is charged as in a hooked pass.

Example:
    >>> import torch
    >>> from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
    >>> from lightning_accudnn.profiling.working_memory import StorageLog
    >>> log = StorageLog()
    >>> ledger = TracedLedger(log)
    >>> x = torch.ones(64); log.created([x])  # 256 bytes, saved by "a"
    >>> handle = ledger.saved(log.key(x), 256, "a", resaved=False)
    >>> y = torch.ones(128); log.created([y])  # 512 bytes nothing saves
    >>> ledger.begin_backward()
    >>> ledger.unpacked(handle)  # the last read of x: off the ledger (autograd may still hold it)
    >>> memory = ledger.working_memory(WorkingMemoryMeter, set(), ["a", "b"])
    >>> memory.forward_bytes, memory.backward_bytes
    ({'a': 512}, {'a': 512})

``y`` is held beyond the levels of ``a``, the last layer to have saved in forward and the
highest with a save to read in backward (``b`` saved nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from lightning_accudnn.profiling.working_memory import StorageLog

__all__ = ["LevelMeter", "LevelWorkingMemory", "MeterFactory", "TracedLedger"]


class LevelWorkingMemory(Protocol):
    """What a :class:`LevelMeter` found beyond each layer's forward and backward level."""

    @property
    def forward_bytes(self) -> Mapping[str, int]: ...

    @property
    def backward_bytes(self) -> Mapping[str, int]: ...


class LevelMeter(Protocol):
    """What :meth:`TracedLedger.working_memory` drives: the calls the engine makes to its meter
    (:class:`lightning_accudnn.ops.working_memory.WorkingMemoryMeter` fits).

    Example:
        >>> from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
        >>> meter: LevelMeter = WorkingMemoryMeter(lambda: 0, lambda: "a")
    """

    def start(self, ledger_bytes: int) -> None: ...

    def changing(self, ledger_bytes: int) -> None: ...

    def acquired(self, nbytes: int) -> None: ...

    def released(self, nbytes: int) -> None: ...

    def saved(self, layer: str) -> None: ...

    def begin_backward(self, ledger_bytes: int, layers: Sequence[str]) -> None: ...

    def read(self, layer: str, ledger_bytes: int, saved_again_by: tuple[str, int] | None = None) -> None: ...

    def end(self, ledger_bytes: int, layers: Sequence[str]) -> LevelWorkingMemory: ...


#: Makes a meter from a reader of the allocator's peak since the previous reading and a reader
#: of the layer running now.
MeterFactory = Callable[[Callable[[], int], Callable[[], str]], LevelMeter]

_ACQUIRE, _RELEASE, _BACKWARD, _SAVED, _READ = range(5)


class TracedLedger:
    """The saved storages of a traced step on the engine's ledger (see the module docstring).

    Example:
        >>> from lightning_accudnn.profiling.working_memory import StorageLog
        >>> ledger = TracedLedger(StorageLog())
        >>> handle = ledger.saved(7, 100, "a", resaved=False)
        >>> ledger.saved(7, 100, "b", resaved=True) != handle, ledger.held_bytes
        (True, 100)
        >>> ledger.begin_backward(); ledger.unpacked(handle); ledger.held_bytes  # one save still unread
        100
    """

    def __init__(self, log: StorageLog) -> None:
        self._log = log
        self._start = log.position
        # (log position, kind, layer, bytes): the ledger's changes and the meter's other calls
        self._events: list[tuple[int, int, str, int]] = []
        self._sizes: dict[int, int] = {}  # storage -> bytes, while on the ledger
        self._owner: dict[int, str] = {}  # storage -> the layer that saved it first
        self._pending: dict[int, int] = {}  # storage -> its saves not read yet
        self._handles: list[int | None] = []  # per save: its storage; None once read
        # Per save of a storage another layer saved first: the layer saving it again, and the
        # number of layers that had saved first then (its position if it saves nothing itself).
        self._saved_again_by: dict[int, tuple[str, int]] = {}
        self._first_savers: dict[str, None] = {}  # layers with a first save, in that order
        self._read_again_by: dict[int, tuple[str, int]] = {}  # per read event: its save's
        self.held_bytes = 0

    def saved(self, storage: int | None, nbytes: int, layer: str, *, resaved: bool) -> int:
        """``layer`` saves ``storage`` (its log key, ``None`` for a tensor without one: a storage
        of its own; ``nbytes``; ``resaved``: saved before in the step, nothing new on the
        ledger); returns the save's handle for :meth:`unpacked`."""
        if storage is None:
            storage = -1 - len(self._handles)  # no log key is negative
        if resaved and storage not in self._sizes:  # saved again once off the ledger: not on it again
            self._handles.append(None)
            return len(self._handles) - 1
        if not resaved:
            self._sizes[storage] = nbytes
            self._owner[storage] = layer
            self._pending[storage] = 0
            self._first_savers[layer] = None
            self._change(_ACQUIRE, layer, nbytes)
        elif layer != self._owner[storage]:
            self._saved_again_by[len(self._handles)] = (layer, len(self._first_savers))
        self._pending[storage] += 1
        self._events.append((self._log.position, _SAVED, self._owner[storage], 0))
        self._handles.append(storage)
        return len(self._handles) - 1

    def begin_backward(self) -> None:
        """The forward is over."""
        self._events.append((self._log.position, _BACKWARD, "", 0))

    def unpacked(self, handle: int) -> None:
        """Autograd reads the save ``handle`` in backward (a read after its first changes nothing)."""
        storage = self._handles[handle]
        if storage is None:
            return
        self._handles[handle] = None
        again = self._saved_again_by.get(handle)
        if again is not None:
            self._read_again_by[len(self._events)] = again
        self._events.append((self._log.position, _READ, self._owner[storage], 0))
        self._pending[storage] -= 1
        if not self._pending[storage]:  # its last read: off the ledger
            del self._owner[storage], self._pending[storage]
            self._change(_RELEASE, "", self._sizes.pop(storage))

    def working_memory(
        self,
        meter_of: MeterFactory,
        leave_out: Collection[int],
        layers: Sequence[str],
        *,
        made_state_bytes: int = 0,
    ) -> LevelWorkingMemory:
        """What the step held beyond each level of ``layers`` (the profile's, in its order),
        charged by a meter from ``meter_of``; the log's storages in ``leave_out`` (model state
        held all step) are not counted as the allocator's. ``made_state_bytes`` are model state
        that the log counts from its creation in the step (the parameters' gradients, when the
        step sets them to ``None``): they are on the ledger from the start, as the planner counts
        model state all step, so that before they exist a level holds less than it counts (its
        working memory is negative by the bytes not made yet).

        Example:
            >>> import torch
            >>> from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
            >>> log = StorageLog()
            >>> ledger = TracedLedger(log)
            >>> x, y = torch.ones(64), torch.ones(64); log.created([x, y])  # 256 bytes each
            >>> a = ledger.saved(log.key(x), 256, "a", resaved=False)
            >>> b = ledger.saved(log.key(y), 256, "b", resaved=False)
            >>> ledger.begin_backward()
            >>> ledger.unpacked(b); del y  # the backward of "b" makes no gradient...
            >>> ledger.unpacked(a)
            >>> grad = torch.ones(32); log.created([grad]); del x  # ... that of "a" a parameter's (128 bytes)
            >>> memory = ledger.working_memory(WorkingMemoryMeter, set(), ["a", "b"], made_state_bytes=128)
            >>> memory.backward_bytes  # "b" ran before the gradient existed: 128 bytes less than counted
            {'b': -128, 'a': 0}
        """
        readings = _Readings(self._log.alive_bytes(leave_out), self._start)
        meter = meter_of(readings.peak, lambda: readings.layer)
        ledger = made_state_bytes
        meter.start(ledger)
        for index, (readings.now, kind, readings.layer, nbytes) in enumerate(self._events):
            if kind == _ACQUIRE:
                meter.changing(ledger)
                meter.acquired(nbytes)
                ledger += nbytes
            elif kind == _RELEASE:
                meter.changing(ledger)
                meter.released(nbytes)
                ledger -= nbytes
            elif kind == _BACKWARD:
                meter.begin_backward(ledger, layers)
            elif kind == _SAVED:
                meter.saved(readings.layer)
            else:
                meter.read(readings.layer, ledger, self._read_again_by.get(index))
        readings.now = self._log.position
        return meter.end(ledger, layers)

    def _change(self, kind: int, layer: str, nbytes: int) -> None:
        self._events.append((self._log.position, kind, layer, nbytes))
        self.held_bytes += nbytes if kind == _ACQUIRE else -nbytes


class _Readings:
    """The log's count read as the allocator's: its peak since the previous reading, at the
    position ``now`` of the log, while ``layer`` runs."""

    def __init__(self, alive: list[int], start: int) -> None:
        self.alive = alive
        self.last = self.now = start
        self.layer = ""

    def peak(self) -> int:
        peak = max(self.alive[self.last : self.now + 1])
        self.last = self.now
        return peak
