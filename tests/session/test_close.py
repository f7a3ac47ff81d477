"""OffloadSession.close runs every release even when one fails: a pool that cannot be freed
must not leave the allocator capped (the next fit would run out of memory under the old cap)."""

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
