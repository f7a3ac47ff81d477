"""The lean checkpoint of whole segments: bitwise what plain autograd computes (dropout, autocast,
BatchNorm, a graph retained and run backward twice), the errors of ``torch.utils.checkpoint`` when
a recomputation saves other tensors, and the cases that take ``torch.utils.checkpoint`` instead."""

from __future__ import annotations

import copy
import gc
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError

from lightning_accudnn.ops import recompute as recompute_module
from lightning_accudnn.ops.lean_recompute import lean_checkpoint, lean_possible
from lightning_accudnn.ops.recompute import SegmentRecomputer


def _model() -> nn.Module:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Dropout(0.3), nn.Linear(16, 8))
    return nn.Sequential(nn.Linear(4, 8), block, nn.Tanh(), nn.Linear(8, 2))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [parameter.grad.clone() for parameter in model.parameters()]


def _run(model: nn.Module, recomputer: SegmentRecomputer | None, backwards: int, autocast: bool) -> list:
    torch.manual_seed(1)
    x = torch.randn(6, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if recomputer is None:
            loss = model(x).float().square().mean()
        else:
            with recomputer.enabled_for_pass():
                loss = model(x).float().square().mean()
    for index in range(backwards):
        loss.backward(retain_graph=index < backwards - 1)
    return [*_grads(model), *(buffer.clone() for buffer in model.buffers())]


@pytest.mark.parametrize("backwards", [1, 2])
@pytest.mark.parametrize("autocast", [False, True])
def test_a_whole_segment_recomputed_lean_is_bitwise_plain(backwards, autocast, monkeypatch):
    calls = []
    monkeypatch.setattr(recompute_module, "checkpoint", lambda *a, **k: calls.append(1))  # never taken
    model = _model()
    reference = copy.deepcopy(model)
    recomputer = SegmentRecomputer()
    recomputer.install(model, ["1"])
    recomputed = _run(model, recomputer, backwards, autocast)
    plain = _run(reference, None, backwards, autocast)
    assert not calls
    assert len(recomputed) == len(plain)
    for a, b in zip(recomputed, plain, strict=True):
        assert torch.equal(a, b)


def test_selective_segments_and_modes_take_torch_checkpoint(monkeypatch):
    taken = []
    original = recompute_module.checkpoint
    monkeypatch.setattr(
        recompute_module, "checkpoint", lambda *a, **k: (taken.append(1), original(*a, **k))[1]
    )
    model = _model()
    recomputer = SegmentRecomputer()
    recomputer.install(model, [], selective=["1"])
    _run(model, recomputer, 1, False)
    assert taken == [1]
    recomputer.install(model, ["1"])
    assert lean_possible()
    with torch.device("cpu"):  # a function mode in force: torch's checkpoint
        assert not lean_possible()
        _run(model, recomputer, 1, False)
    assert taken == [1, 1]


def test_a_recomputation_that_saves_other_tensors_raises_checkpoint_error():
    state = {"wide": True}

    def changing(x: torch.Tensor) -> torch.Tensor:
        return (x.repeat(1, 2) if state["wide"] else x).sin().sum(dim=-1)

    x = torch.randn(3, 4, requires_grad=True)
    y = lean_checkpoint(changing, (x,))
    state["wide"] = False
    with pytest.raises(CheckpointError, match="saved tensor 0"):
        y.sum().backward()

    def fewer(x: torch.Tensor) -> torch.Tensor:
        return x.sin().cos() if state["wide"] else x.sin()

    state["wide"] = True
    y = lean_checkpoint(fewer, (x,))
    state["wide"] = False
    with pytest.raises(CheckpointError, match="saved 2 tensors, its recomputation 1"):
        y.sum().backward()


def test_an_unpack_outside_backward_recomputes_for_itself():
    x = torch.randn(5, requires_grad=True)
    y = lean_checkpoint(lambda t: t.exp(), (x,))
    assert torch.equal(y.grad_fn._saved_result, x.exp())  # exp saves its result: unpacked here
    y.sum().backward()
    assert torch.equal(x.grad, x.exp().detach())


def test_fx_tracing_takes_torch_checkpoint_without_a_warning():
    seen = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(lean_possible())
            return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lean_possible()
        torch.fx.symbolic_trace(Probe())
    assert seen == [False]


def test_a_backward_that_unpacks_part_of_the_saves_leaves_the_next_one_exact():
    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)

    def block(t: torch.Tensor) -> torch.Tensor:
        return second(torch.tanh(first(t)).sin())

    x = torch.randn(3, 4, requires_grad=True)
    loss = lean_checkpoint(block, (x,)).square().sum()
    expected = block(x).square().sum()
    partial = torch.autograd.grad(loss, second.weight, retain_graph=True)  # unpacks second's save only
    assert torch.equal(partial[0], torch.autograd.grad(expected, second.weight, retain_graph=True)[0])
    for index in range(2):  # each backward recomputes for itself
        parameters = (x, first.weight, first.bias, second.weight)
        got = torch.autograd.grad(loss, parameters, retain_graph=index == 0)
        want = torch.autograd.grad(expected, parameters, retain_graph=index == 0)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_save_unpacked_twice_in_one_backward_raises_checkpoint_error():
    x = torch.randn(5, requires_grad=True)
    y = lean_checkpoint(lambda t: t.sin(), (x,))
    node = y.grad_fn
    node.register_prehook(lambda grads: (node._saved_self, None)[1])  # read before the node reads it
    with pytest.raises(CheckpointError, match="unpacked twice"):
        y.sum().backward()


def test_a_recomputation_leaves_nothing_alive_after_its_backward():
    # The first ReLU saves its own output; the second one's save ends the recomputation early.
    linear = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)

    def step() -> None:
        lean_checkpoint(lambda t: torch.relu(torch.relu(linear(t)) * 2), (x,)).sum().backward()

    def live_tensors() -> int:
        gc.collect()
        return sum(issubclass(type(value), torch.Tensor) for value in gc.get_objects())

    step()
    before = live_tensors()
    for _ in range(3):
        step()
    assert live_tensors() == before
