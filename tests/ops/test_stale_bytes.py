"""A later save is never served bytes copied before they changed.

GRU and LSTM cells split one storage with ``unsafe_chunk`` (outputs that do not share a
version counter) and write the parts in place after the first part was saved: each save
must read what autograd would read without hooks.
"""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule


def _unsafe_chunk_gates(weight: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    gates = inputs @ weight
    a, b = gates.unsafe_chunk(2, 1)
    a = a.sigmoid_()
    b = b.tanh_()
    return (2 * a + 3 * b).sum()


def _swapped_everything(engine: OffloadEngine, module: nn.Module, run):
    with engine.offload(module, SwapSchedule.swap_everything()):
        loss = run()
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_out > 0
    assert engine.pool.in_use_bytes == 0
    assert engine.ledger.activation_bytes == 0


def test_unsafe_chunk_written_in_place_after_a_save():
    torch.manual_seed(0)
    weight = torch.randn(64, 128, requires_grad=True)
    inputs = torch.randn(32, 64)
    _unsafe_chunk_gates(weight, inputs).backward()
    expected, weight.grad = weight.grad, None

    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    _swapped_everything(engine, nn.Module(), lambda: _unsafe_chunk_gates(weight, inputs))
    assert torch.equal(weight.grad, expected)


RECURRENT = {
    "gru": (lambda: nn.GRU(16, 32, num_layers=2), lambda: torch.randn(6, 4, 16)),
    "lstm_cell": (lambda: nn.LSTMCell(16, 32), lambda: torch.randn(4, 16)),
    "gru_cell": (lambda: nn.GRUCell(16, 32), lambda: torch.randn(4, 16)),
}


def _decode(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The module over a few steps, feeding its state back (as a decoder does)."""
    if isinstance(module, nn.GRU):
        output, _ = module(inputs)
        return output.square().sum()
    state = None
    total = torch.zeros(())
    for _ in range(3):
        state = module(inputs, state)
        hidden = state[0] if isinstance(state, tuple) else state
        total = total + hidden.square().sum()
    return total


@pytest.mark.parametrize("kind", list(RECURRENT))
def test_recurrent_layers_bitwise_equal_under_forced_swapping(kind):
    make_module, make_inputs = RECURRENT[kind]
    torch.manual_seed(0)
    reference = make_module()
    swapped = copy.deepcopy(reference)
    inputs = make_inputs()
    _decode(reference, inputs).backward()

    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    _swapped_everything(engine, swapped, lambda: _decode(swapped, inputs))
    for (name, a), b in zip(reference.named_parameters(), swapped.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), f"{kind}: gradient of {name} differs"
