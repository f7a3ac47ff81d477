"""The engine's ledger as the trace keeps it: when a save leaves it, and whose backward runs."""

from __future__ import annotations

import torch

from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.profiling.traced_ledger import TracedLedger
from lightning_accudnn.profiling.working_memory import StorageLog


def _ledger() -> TracedLedger:
    return TracedLedger(StorageLog())


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
    """The root saved first in the profile's order and read first in backward (a loss): what
    its backward holds is charged to the level of the highest layer still holding its saves,
    which counts them all, not to the root's, which counts its own only."""
    log = StorageLog()
    ledger = TracedLedger(log)
    tensors = {name: torch.ones(4) for name in ("root", "a", "b")}
    log.created(tensors.values())
    handles = {
        name: ledger.saved(log.key(tensor), 16, name, resaved=False) for name, tensor in tensors.items()
    }
    ledger.begin_backward()
    ledger.unpacked(handles["root"])  # the loss's backward reads its save...
    gradient = torch.ones(256)  # ... and holds 1 KiB of gradients
    log.created([gradient])
    del gradient
    ledger.unpacked(handles["b"])
    ledger.unpacked(handles["a"])
    memory = ledger.working_memory(WorkingMemoryMeter, set(), ["root", "a", "b"])
    assert memory.backward_bytes["b"] >= 1024
    assert memory.backward_bytes.get("root", 0) < 1024
