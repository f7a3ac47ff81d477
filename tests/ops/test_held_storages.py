"""A storage the caller holds beyond the forward (the batch) frees nothing when swapped: a hooked
pass that swapped it finds it alive when the forward ends, reports it held, not swappable, and a
schedule that names its save keeps it on the device, in hooked and replayed passes alike, with
the same gradients."""

import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.ops.layers import HELD, SWAPPABLE

SWAP_ALL = SwapSchedule.swap_everything(max_copying_out_bytes=0)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


def _step(engine: OffloadEngine, model: nn.Module, x: torch.Tensor, schedule: SwapSchedule, sequence=None):
    model.zero_grad(set_to_none=True)
    with engine.offload(model, schedule, sequence=sequence):
        loss = model(x).square().sum()
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    return stats, [parameter.grad.clone() for parameter in model.parameters()]


def test_the_batch_is_found_held_and_kept_by_a_schedule_naming_it():
    model, engine = _model(), OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    x = torch.randn(256, 64)  # the caller holds it all step
    profiled, plain_grads = _step(engine, model, x, SWAP_ALL)
    sequence = profiled.sequence
    assert sequence is not None
    held = [ordinal for ordinal, kind in enumerate(sequence.kinds) if kind == HELD]
    assert [sequence.layers[ordinal] for ordinal in held] == ["0"]
    assert sequence.record_bytes[held[0]] == x.nbytes
    first = next(layer for layer in profiled.layers if layer.name == "0")
    assert (first.saved_bytes, first.swappable_bytes) == (x.nbytes, 0)

    assert sequence.held_records() == {("0", 0)}
    keeping = SWAP_ALL.with_held_records(sequence.held_records())
    hooked, hooked_grads = _step(engine, model, x, keeping)
    assert hooked.bytes_swapped_out == profiled.bytes_swapped_out - x.nbytes
    assert hooked.sequence is not None and hooked.sequence.kinds[held[0]] == HELD
    replayed, replayed_grads = _step(engine, model, x, keeping, sequence=hooked.sequence)
    assert replayed.bytes_swapped_out == hooked.bytes_swapped_out

    for grads in (hooked_grads, replayed_grads):
        assert all(torch.equal(a, b) for a, b in zip(plain_grads, grads, strict=True))
    engine.close()


def test_an_input_the_caller_lets_go_during_the_forward_stays_swappable():
    model, engine = _model(), OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    model.zero_grad(set_to_none=True)
    with engine.offload(model, SWAP_ALL):
        loss = model(torch.randn(256, 64)).square().sum()  # only the forward holds its input
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.sequence is not None
    assert HELD not in stats.sequence.kinds
    assert stats.sequence.kinds[stats.sequence.layers.index("0")] == SWAPPABLE
    engine.close()
