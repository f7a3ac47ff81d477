"""The engine's ledger as the trace keeps it: when a save leaves it, and whose backward runs."""

from __future__ import annotations

from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.profiling.traced_ledger import TracedLedger
from lightning_accudnn.profiling.working_memory import StorageLog

POSITIONS = {"root": 0, "a": 1, "b": 2}


class _Reads(WorkingMemoryMeter):
    """The meter, noting which layer's backward it was told runs."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.reads: list[str] = []

    def read(self, layer: str, ledger_bytes: int) -> None:
        self.reads.append(layer)
        super().read(layer, ledger_bytes)


def _ledger() -> TracedLedger:
    return TracedLedger(StorageLog(), POSITIONS.__getitem__)


def test_a_storage_saved_twice_leaves_at_its_last_read():
    ledger = _ledger()
    first = ledger.saved(1, 100, "a", resaved=False)
    again = ledger.saved(1, 100, "b", resaved=True)
    ledger.begin_backward()
    ledger.unpacked(again)
    ledger.unpacked(again)  # a second read of the same save changes nothing
    assert ledger.held_bytes == 100
    ledger.unpacked(first)
    assert ledger.held_bytes == 0
    late = ledger.saved(1, 100, "a", resaved=True)  # saved again once off the ledger
    ledger.unpacked(late)
    assert ledger.held_bytes == 0


def test_the_backward_that_runs_is_the_highest_layer_still_holding_what_it_saved_first():
    """The root saved first in the profile's order and read first in backward (a loss): its
    read does not end the backward of the layers above it."""
    ledger = _ledger()
    loss = ledger.saved(1, 10, "root", resaved=False)
    a = ledger.saved(2, 10, "a", resaved=False)
    b = ledger.saved(3, 10, "b", resaved=False)
    ledger.begin_backward()
    for handle in (loss, b, a):
        ledger.unpacked(handle)
    meters: list[_Reads] = []

    def meter(*args):
        meters.append(_Reads(*args))
        return meters[-1]

    ledger.working_memory(meter, set(), list(POSITIONS))
    assert meters[0].reads == ["b", "a"]  # b's backward runs through the loss's read; then a's
