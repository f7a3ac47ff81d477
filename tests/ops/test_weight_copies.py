"""Under torch.autocast, the low-precision copy of a weight that a linear layer saves is model
state: never swapped, counted as static memory, and gradients are unchanged."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session import OffloadConfig, OffloadSession


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


#: The bf16 weights the second and third linear layers save (the first one's input needs no
#: gradient, so its weight is not saved).
WEIGHT_COPY_BYTES = (512 * 512 + 10 * 512) * 2


def _batch(seed: int = 0) -> torch.Tensor:
    return torch.randn(32, 256, generator=torch.Generator().manual_seed(seed))


def _saved_storage_bytes(model: nn.Module) -> int:
    """Every storage autograd saves in one autocast forward, counted once (no engine)."""
    storages: dict[int, int] = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
    ):
        model(_batch()).float().square().mean()
    return sum(storages.values())


def test_the_autocast_weight_copy_is_not_swapped_and_gradients_are_unchanged():
    plain, swapped = _model(), _model()
    saved = _saved_storage_bytes(plain)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = plain(_batch()).float().square().mean()
    loss.backward()

    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(swapped, SwapSchedule.swap_everything()), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = swapped(_batch()).float().square().mean()
    copies = engine.weight_copies.take()
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and not stats.autocast_past_forward

    assert copies == {"2": 512 * 512 * 2, "4": 10 * 512 * 2}  # under the layers saving them
    assert sum(layer.saved_bytes for layer in stats.layers) == saved - WEIGHT_COPY_BYTES
    assert stats.bytes_swapped_out == saved - WEIGHT_COPY_BYTES  # every activation, no weight
    for a, b in zip(plain.parameters(), swapped.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    engine.close()


def test_full_precision_has_no_weight_copies():
    model = _model()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.swap_everything()):
        loss = model(_batch()).sum()
    assert engine.weight_copies.take() == {}
    loss.backward()
    engine.end_step()


@pytest.mark.filterwarnings("ignore:lightning-accudnn on CPU")
def test_the_session_counts_weight_copies_as_model_state_and_trains_like_plain_autocast():
    plain, model = _model(), _model()
    reference = copy.deepcopy(plain)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, model)]
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    for step in range(5):  # profiling, refining, then passes replayed by ordinal
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = plain(_batch(step)).float().square().mean()
        loss.backward()
        with session.step(model, optimizers[1]), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(_batch(step)).float().square().mean()
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        assert session.plan is not None
        assert (
            session.plan.profile.static_bytes == model_state_bytes(model, [optimizers[1]]) + WEIGHT_COPY_BYTES
        )
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(plain.parameters(), reference.parameters(), strict=True))
    session.close()
