"""A profiled save sequence compiled against a schedule: which saves take the kept fast path.

In a pass replayed by ordinal the engine needs no record for a saved tensor that the plan
keeps: autograd holds the tensor, and the engine counts its storage's bytes by address. A
save may take that path when no save of its storage (its *group*: the saves of the step
at the same storage address in the profiled pass) opened a record that the schedule swaps;
the others go through the engine's records as in a profiled pass. Among those, a storage
whose saves all used the one record its first save opened, over the storage's whole bytes,
swapped by the schedule (one activation saved once or more: the common case) takes a
shorter path through the records (:data:`SWAP_WHOLE`, :data:`SWAP_AGAIN`): the profiled
pass already applied the filter and measured its extent.

The layer figures a replayed pass reports come from the same data: the fast saves' records
are those of the profiled pass (same graph, same saves), added to what the recorded saves
measured now.
"""

from __future__ import annotations

from lightning_accudnn.ops.layers import FILTERED, REUSED, SWAPPABLE, SaveSequence
from lightning_accudnn.ops.schedule import SwapSchedule

#: What a replayed pass does at an ordinal (:attr:`ReplayRoute.actions`): hand the tensor back
#: to autograd untouched (no activation when profiled),
LEAVE = 0
#: keep it and count its storage (the storage's first save),
KEEP_NEW = 1
#: keep it, its storage counted already (saved again),
KEEP_AGAIN = 2
#: save it through the engine's records (its storage is swapped, in part or whole),
RECORD = 3
#: open the one record of a storage swapped whole (the storage's first save),
SWAP_WHOLE = 4
#: or save again a storage swapped whole (a later save of the same bytes, the same lineage).
SWAP_AGAIN = 5


class ReplayRoute:
    """Per ordinal of ``sequence``: what a replayed pass does with the save under ``schedule``.

    Example:
        >>> sequence = SaveSequence()
        >>> sequence.append("a", False, 64, kind=SWAPPABLE, record_bytes=64)
        >>> sequence.append("a", False, 0, kind=FILTERED)
        >>> sequence.append("b", False, 64, kind=SWAPPABLE, record_bytes=64)
        >>> sequence.append("b", False, 64, group=2, kind=REUSED, record_of=2)
        >>> route = ReplayRoute(sequence, SwapSchedule.swap_layers_named(["b"]))
        >>> route.actions == [KEEP_NEW, LEAVE, RECORD, RECORD], route.last_recorded
        (True, 3)
        >>> sequence.append("c", False, 64, tensor_bytes=64, kind=SWAPPABLE, record_bytes=64)
        >>> sequence.append("d", False, 64, tensor_bytes=64, group=4, kind=REUSED, record_of=4)
        >>> actions = ReplayRoute(sequence, SwapSchedule.swap_layers_named(["b", "c"])).actions
        >>> actions[2:] == [RECORD, RECORD, SWAP_WHOLE, SWAP_AGAIN]
        True
        >>> for _ in range(2):  # a layer saving two whole storages: their copies go as one group
        ...     sequence.append("e", False, 64, tensor_bytes=64, kind=SWAPPABLE, record_bytes=64)
        >>> ReplayRoute(sequence, SwapSchedule.swap_layers_named(["c", "e"])).group_ends[4:]
        [True, True, False, True]
        >>> route.layer_bytes(len(route))
        ({'a': 64}, {'a': 64})
    """

    __slots__ = (
        "sequence",
        "schedule",
        "fast",
        "actions",
        "group_ends",
        "last_recorded",
        "_totals",
        "_order",
    )

    def __init__(self, sequence: SaveSequence, schedule: SwapSchedule) -> None:
        self.sequence = sequence
        self.schedule = schedule
        swapped_groups = {
            group
            for group, kind, layer in zip(sequence.groups, sequence.kinds, sequence.layers, strict=True)
            if kind == SWAPPABLE and schedule.swaps(layer)
        }
        self.fast = [group not in swapped_groups for group in sequence.groups]
        self.actions = [
            _action(ordinal, kind, fast, group)
            for ordinal, (kind, fast, group) in enumerate(
                zip(sequence.kinds, self.fast, sequence.groups, strict=True)
            )
        ]
        for ordinal in _swapped_whole(sequence, swapped_groups, schedule):
            self.actions[ordinal] = SWAP_WHOLE if sequence.groups[ordinal] == ordinal else SWAP_AGAIN
        #: Per ordinal: whether the copies out not issued yet are issued with this save's; false
        #: only at a storage swapped whole that the same layer's next such storage follows (the
        #: copies of a layer's whole storages go as one group, at the last of them).
        self.group_ends = _group_ends(sequence, self.actions)
        #: The last ordinal saved through the engine's records (-1 when none is): every save
        #: after it is kept or left alone, so a pass need not see them (see
        #: :meth:`.OffloadEngine.offload`, ``observe=False``).
        self.last_recorded = max(
            (ordinal for ordinal, action in enumerate(self.actions) if action >= RECORD), default=-1
        )
        self._totals: tuple[dict[str, int], dict[str, int]] | None = None
        self._order: list[str] | None = None

    def __len__(self) -> int:
        return len(self.fast)

    def compiled_for(self, sequence: SaveSequence, schedule: SwapSchedule) -> bool:
        """Whether this route is the one for ``sequence`` under ``schedule``."""
        return sequence is self.sequence and schedule == self.schedule

    def layer_bytes(self, end: int) -> tuple[dict[str, int], dict[str, int]]:
        """Saved and swappable bytes per layer of the records that the fast saves and the
        storages swapped whole (:data:`SWAP_WHOLE`) before ordinal ``end`` opened in the
        profiled pass (what the engine's records would have counted; a save that does not
        match what was profiled ends the replay there). Shared: not to be changed by the caller."""
        if end == len(self) and self._totals is not None:
            return self._totals
        saved: dict[str, int] = {}
        swappable: dict[str, int] = {}
        sequence = self.sequence
        for ordinal in range(end):
            kind = sequence.kinds[ordinal]
            if not (self.fast[ordinal] or self.actions[ordinal] == SWAP_WHOLE) or kind in (REUSED, FILTERED):
                continue
            layer, nbytes = sequence.layers[ordinal], sequence.record_bytes[ordinal]
            saved[layer] = saved.get(layer, 0) + nbytes
            if kind == SWAPPABLE:
                swappable[layer] = swappable.get(layer, 0) + nbytes
        if end == len(self):
            self._totals = (saved, swappable)
        return saved, swappable

    def first_records(self, end: int) -> list[str]:
        """The layers that opened records before ordinal ``end`` in the profiled pass, in order."""
        if end == len(self) and self._order is not None:
            return self._order
        sequence = self.sequence
        order = list(
            dict.fromkeys(
                sequence.layers[ordinal]
                for ordinal in range(end)
                if sequence.kinds[ordinal] != REUSED and sequence.kinds[ordinal] != FILTERED
            )
        )
        if end == len(self):
            self._order = order
        return order


def _action(ordinal: int, kind: int, fast: bool, group: int) -> int:
    if kind == FILTERED:
        return LEAVE
    if not fast:
        return RECORD
    return KEEP_NEW if group == ordinal else KEEP_AGAIN


def _group_ends(sequence: SaveSequence, actions: list[int]) -> list[bool]:
    ends = [True] * len(actions)
    opened = [ordinal for ordinal, action in enumerate(actions) if action == SWAP_WHOLE]
    for ordinal, following in zip(opened, opened[1:], strict=False):
        ends[ordinal] = sequence.layers[ordinal] != sequence.layers[following]
    return ends


def _swapped_whole(sequence: SaveSequence, swapped_groups: set[int], schedule: SwapSchedule) -> list[int]:
    """The ordinals of the saves of swapped storages that had one record, opened by their first
    save over the storage's whole bytes (``tensor_bytes == sizes == record_bytes``); the
    storages a schedule keeps when they pass the host cap are left to the records."""
    if schedule.keep_beyond_host_limit:
        return []
    whole = {
        ordinal
        for ordinal in swapped_groups
        if sequence.kinds[ordinal] == SWAPPABLE
        and sequence.tensor_bytes[ordinal] == sequence.sizes[ordinal] == sequence.record_bytes[ordinal]
    }
    for ordinal, (group, kind, record_of) in enumerate(
        zip(sequence.groups, sequence.kinds, sequence.record_of, strict=True)
    ):
        if group in whole and ordinal != group and (kind != REUSED or record_of != group):
            whole.discard(group)  # the storage had another record: the records sort it out
    return [ordinal for ordinal, group in enumerate(sequence.groups) if group in whole]
