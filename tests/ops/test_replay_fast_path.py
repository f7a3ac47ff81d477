"""The kept fast path: in a pass replayed by ordinal a kept saved tensor has no record
(autograd holds ``(tensor, version, address, ordinal, step)``), yet everything a record did still
holds: gradients bitwise equal, in-place changes raise, the ledger counts each storage once and
back to zero, retained graphs and aborted steps behave as in a hooked pass."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, StaleSavedTensorError, SwapSchedule
from tests.models import SmallResNet, loss_of, make_batch


def _deep(width: int = 32, depth: int = 6) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    return nn.Sequential(*layers)


def _half(sequence) -> SwapSchedule:
    names = sorted(set(sequence.layers))
    return SwapSchedule.keep_layers_named(names[::2], prefetch_window_bytes=0, max_copying_out_bytes=0)


def _profiled(engine: OffloadEngine, model: nn.Module, x: torch.Tensor):
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = model(x).square().sum()
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.sequence is not None
    model.zero_grad(set_to_none=True)
    return stats


@pytest.mark.parametrize("which", ["keep", "half"])
def test_replayed_passes_are_bitwise_equal_and_the_ledger_returns_to_zero(which):
    torch.manual_seed(0)
    model = _deep()
    plain = copy.deepcopy(model)
    x = torch.randn(4, 32)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    profiled = _profiled(engine, model, x)
    sequence = profiled.sequence
    schedule = SwapSchedule.keep_everything() if which == "keep" else _half(sequence)
    for _ in range(3):
        with engine.offload(model, schedule, sequence=sequence):
            loss = model(x).square().sum()
        loss.backward()
        stats = engine.end_step()
        assert stats is not None and not stats.timed and not stats.graph_changed
        assert [(layer.name, layer.saved_bytes, layer.swappable_bytes) for layer in stats.layers] == [
            (layer.name, layer.saved_bytes, layer.swappable_bytes) for layer in profiled.layers
        ]
        assert stats.ledger_peak_bytes <= profiled.ledger_peak_bytes
        assert (stats.bytes_swapped_out > 0) == (which == "half")
        assert engine.ledger.activation_bytes == 0
        plain(x).square().sum().backward()
        for a, b in zip(model.parameters(), plain.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad)
    engine.close()


def test_in_place_change_of_a_fast_kept_tensor_raises_like_plain_pytorch():
    def forward(x: torch.Tensor, change: bool) -> torch.Tensor:
        y = x.sigmoid()
        z = y * 2
        if change:
            y.mul_(3)  # sigmoid's backward needs its output, now changed
        return z.sum()

    x = torch.randn(16, 16, requires_grad=True)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(nn.Identity(), SwapSchedule.keep_everything()):
        loss = forward(x, change=False)
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    with engine.offload(nn.Identity(), SwapSchedule.keep_everything(), sequence=stats.sequence):
        loss = forward(x, change=True)
    with pytest.raises(RuntimeError, match="is at version 1; expected version 0 instead"):
        loss.backward()
    engine.abort_step()


def test_a_retained_graph_runs_backward_twice_and_counts_its_storages_once():
    torch.manual_seed(0)
    model = _deep()
    plain = copy.deepcopy(model)
    x = torch.randn(4, 32)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    sequence = _profiled(engine, model, x).sequence
    with engine.offload(model, SwapSchedule.keep_everything(), sequence=sequence):
        loss = model(x).square().sum()
    counted = engine.ledger.activation_bytes
    assert counted > 0
    loss.backward(retain_graph=True)
    assert engine.ledger.activation_bytes == 0  # every storage read once: out of the count
    loss.backward()  # the second read counts nothing again
    assert engine.ledger.activation_bytes == 0
    assert engine.end_step() is not None
    plain_loss = plain(x).square().sum()
    plain_loss.backward(retain_graph=True)
    plain_loss.backward()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_an_aborted_replayed_step_refuses_backward():
    torch.manual_seed(0)
    model = _deep()
    x = torch.randn(4, 32)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    sequence = _profiled(engine, model, x).sequence
    schedule = SwapSchedule.keep_everything()
    with pytest.raises(ZeroDivisionError), engine.offload(model, schedule, sequence=sequence):
        loss = model(x).square().sum()
        raise ZeroDivisionError("boom")
    assert engine.ledger.activation_bytes == 0 and not engine.step_open
    with pytest.raises(StaleSavedTensorError):
        loss.backward()


def test_storages_shared_otherwise_than_profiled_mark_the_graph_changed():
    x = torch.randn(8, 8, requires_grad=True)

    def forward(share: bool) -> torch.Tensor:
        a = x.sin()
        b = a if share else x.cos()  # same sizes, but one storage saved twice instead of two
        return (a.exp() * b.exp()).sum()

    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(nn.Identity(), SwapSchedule.keep_everything()):
        loss = forward(share=False)
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    with engine.offload(nn.Identity(), SwapSchedule.keep_everything(), sequence=stats.sequence):
        loss = forward(share=False)
    loss.backward()
    replayed = engine.end_step()
    assert replayed is not None and not replayed.graph_changed
    with engine.offload(nn.Identity(), SwapSchedule.keep_everything(), sequence=stats.sequence):
        loss = forward(share=True)
    loss.backward()
    changed = engine.end_step()
    assert changed is not None and changed.graph_changed
    assert engine.ledger.activation_bytes == 0


def test_a_resnet_replayed_with_half_swapped_matches_plain_pytorch():
    torch.manual_seed(0)
    model = SmallResNet()
    plain = copy.deepcopy(model)
    batch = make_batch("cnn")
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = loss_of(model, batch)
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.sequence is not None
    model.zero_grad(set_to_none=True)
    schedule = _half(stats.sequence)
    for _ in range(2):
        with engine.offload(model, schedule, sequence=stats.sequence):
            loss = loss_of(model, batch)
        loss.backward()
        replayed = engine.end_step()
        assert replayed is not None and not replayed.graph_changed and replayed.bytes_swapped_out > 0
        assert engine.ledger.activation_bytes == 0
    for _ in range(2):
        loss_of(plain, batch).backward()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
