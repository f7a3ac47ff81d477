"""OffloadSession.close runs every release even when one fails: a pool that cannot be freed
must not leave the allocator capped (the next fit would run out of memory under the old cap)."""

import gc
import weakref

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.models import loss_of, make_batch, make_model


class RecordingAllocator:
    def __init__(self) -> None:
        self.lifted = 0

    def cap(self, budget_bytes: int) -> None:
        pass

    def lift(self) -> None:
        self.lifted += 1

    def peaks(self) -> None:
        return None

    def allocated_peak_reader(self) -> None:
        return None


def test_a_failing_engine_close_still_lifts_the_allocator_cap(monkeypatch):
    model = make_model("cnn")
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), torch.device("cpu"))
    allocator = RecordingAllocator()
    session.allocator = allocator
    batch = make_batch("cnn", 4, seed=0)
    with session.step(model):
        loss = loss_of(model, batch)
    loss.backward()

    def failing_close() -> None:
        raise RuntimeError("the pool could not be freed")

    monkeypatch.setattr(session.engine, "close", failing_close)
    with pytest.raises(RuntimeError, match="could not be freed"):
        session.close()
    assert allocator.lifted == 1


def test_a_closed_session_lets_the_model_go_without_a_collection():
    """Dropping the model after close frees it at once: nothing of the session, still alive or
    waiting for the cyclic collector, holds it (on a GPU, its weights)."""
    model = make_model("cnn")
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for seed in range(3):  # profiling, then passes replayed by ordinal
        with session.step(model, optimizer):
            loss = loss_of(model, make_batch("cnn", 4, seed=seed))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    session.close()
    gone = weakref.ref(model)
    del model, optimizer, loss
    gc.disable()
    try:
        assert gone() is None
    finally:
        gc.enable()
    del session
