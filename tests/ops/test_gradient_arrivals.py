"""The gradients a backward has still to make: counted down as autograd accumulates each, once
per storage, and the hooks that count them gone when the pass is over, or fails."""

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.ops.gradient_arrivals import GradientArrivals
from tests._torch_internals import post_accumulate_grad_hook_count


def _two_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))  # 144 and 68 parameters


def test_the_gradients_to_come_fall_as_the_backward_makes_them():
    model = _two_layers()
    arrivals = GradientArrivals(model.parameters())
    assert arrivals.to_come_bytes == (144 + 68) * 4
    hidden = model[1](model[0](torch.randn(3, 8)))
    seen = []
    # When the first layer's output gradient is ready, the last layer's weight gradients are made
    # (autograd runs an accumulation as soon as it can), and the first layer's are not.
    hidden.register_hook(lambda grad: seen.append(arrivals.to_come_bytes))
    model[2](hidden).sum().backward()
    assert seen == [144 * 4]
    assert arrivals.to_come_bytes == 0
    arrivals.close()


def test_tied_frozen_and_already_made_gradients_are_not_to_come():
    model = _two_layers()
    model[0].bias.requires_grad_(False)  # frozen: no gradient
    model[2].weight.grad = torch.zeros_like(model[2].weight)  # accumulating: already made
    tied = [model[0].weight, model[0].weight, model[2].bias, model[2].weight]
    arrivals = GradientArrivals(tied)
    assert arrivals.to_come_bytes == (128 + 4) * 4
    arrivals.close()


def test_closed_it_counts_nothing_more_and_leaves_no_hook():
    model = _two_layers()
    arrivals = GradientArrivals(model.parameters())
    assert post_accumulate_grad_hook_count(model) == 4
    arrivals.close()
    assert post_accumulate_grad_hook_count(model) == 0
    model(torch.randn(3, 8)).sum().backward()
    assert arrivals.to_come_bytes == (144 + 68) * 4


def test_a_measuring_pass_leaves_no_hook_when_it_ends_or_fails():
    model = _two_layers()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    schedule = SwapSchedule.keep_everything()
    with engine.offload(model, schedule, allocated_peak=lambda: 0):
        loss = model(torch.randn(3, 8)).sum()
        assert post_accumulate_grad_hook_count(model) == 4
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and post_accumulate_grad_hook_count(model) == 0
    model.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="boom"), engine.offload(model, schedule, allocated_peak=lambda: 0):
        model(torch.randn(3, 8)).sum()
        raise RuntimeError("boom")
    assert post_accumulate_grad_hook_count(model) == 0
    engine.close()
