"""What is in force while a segment is recomputed: training norms update scratch statistics that
are made once and reused, the segment's tree as it is at each recomputation (a norm put in,
replaced, switched to eval or moved since is seen), nested entries, and the inputs' versions."""

from __future__ import annotations

import gc

import torch
from torch import nn

from lightning_accudnn.ops.recomputation_scope import RecomputationScope, is_recomputing
from lightning_accudnn.ops.segment_inputs import SegmentInputs

STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def _statistics(module: nn.Module) -> list[torch.Tensor]:
    return [
        buffer
        for name, buffer in module.named_buffers()
        if name.rsplit(".", 1)[-1].startswith(("running", "num"))
    ]


def _recompute(scope: RecomputationScope, module: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Run ``module`` inside ``scope``; the statistics objects it saw there."""
    with scope:
        assert is_recomputing()
        module(x)
        return _statistics(module)


def test_scratch_statistics_are_made_once_and_the_buffers_are_untouched() -> None:
    block = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    )
    originals = _statistics(block)
    values = [buffer.clone() for buffer in originals]
    scope = RecomputationScope(block)
    first = _recompute(scope, block, torch.randn(5, 3))
    second = _recompute(scope, block, torch.randn(5, 3))
    assert not is_recomputing()
    assert len(first) == len(originals) == 6
    assert all(a is b for a, b in zip(first, second, strict=True))  # reused, not cloned again
    assert not any(a is b for a, b in zip(first, originals, strict=True))
    assert all(a is b for a, b in zip(_statistics(block), originals, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(originals, values, strict=True))


def test_a_norm_put_in_replaced_or_switched_to_eval_since_is_seen() -> None:
    block = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    scope = RecomputationScope(block)
    _recompute(scope, block, torch.randn(5, 3))
    block.append(nn.BatchNorm1d(4))  # put in
    added = _statistics(block[2])
    seen = _recompute(scope, block, torch.randn(5, 3))
    assert not any(a is b for a, b in zip(seen[3:], added, strict=True))
    assert torch.equal(block[2].running_mean, torch.zeros(4))
    block[1] = nn.BatchNorm1d(4)  # replaced
    replaced = _statistics(block[1])
    seen = _recompute(scope, block, torch.randn(5, 3))
    assert not any(a is b for a, b in zip(seen[:3], replaced, strict=True))
    assert torch.equal(block[1].running_mean, torch.zeros(4))
    block[1].eval()  # in eval its running statistics are what its output is computed from: kept
    seen = _recompute(scope, block, torch.randn(5, 3))
    assert all(a is b for a, b in zip(seen[:3], replaced, strict=True))
    assert not any(a is b for a, b in zip(seen[3:], added, strict=True))
    assert torch.equal(block[2].running_mean, torch.zeros(4))


def test_buffers_replaced_since_get_new_scratch_of_their_kind() -> None:
    block = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    scope = RecomputationScope(block)
    _recompute(scope, block, torch.randn(5, 3))
    block.double()  # every floating buffer replaced by a float64 one
    originals = _statistics(block)
    seen = _recompute(scope, block, torch.randn(5, 3, dtype=torch.float64))
    assert [buffer.dtype for buffer in seen] == [buffer.dtype for buffer in originals]
    assert not any(a is b for a, b in zip(seen, originals, strict=True))
    assert all(a is b for a, b in zip(_statistics(block), originals, strict=True))
    assert torch.equal(block[1].running_var, torch.ones(4, dtype=torch.float64))


def test_nested_entries_put_back_what_each_swapped() -> None:
    inner = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    outer = nn.Sequential(inner, nn.BatchNorm1d(4))
    originals = _statistics(outer)
    outer_scope, inner_scope = RecomputationScope(outer), RecomputationScope(inner)
    for _ in range(2):
        with outer_scope:
            with outer_scope, inner_scope:  # the same scope again, and a segment inside it
                outer(torch.randn(5, 3))
            outer(torch.randn(5, 3))
        assert not is_recomputing()
        assert all(a is b for a, b in zip(_statistics(outer), originals, strict=True))
        assert torch.equal(outer[1].running_mean, torch.zeros(4))
        assert torch.equal(inner[1].num_batches_tracked, torch.tensor(0))


def test_an_input_that_died_is_not_a_change_and_one_written_is() -> None:
    x, y = torch.ones(2), torch.ones(3)
    inputs, tensors = SegmentInputs.record((x, y), {})
    assert tensors == (x, y)
    del tensors, x
    gc.collect()
    assert inputs.changed_since_call() is None
    y.add_(1)
    assert (
        inputs.changed_since_call()
        == "its tensor argument 1 (shape (3,)) was written in place after the call"
    )
