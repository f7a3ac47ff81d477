"""Unusual inputs: nested, quantized and subclass tensors saved for backward are kept (never
crash), and an in-place change of a saved activation raises the error plain PyTorch raises."""

import pytest
import torch

from lightning_accudnn.ops import OffloadEngine, SwapSchedule


class SavesAlongside(torch.autograd.Function):
    """``x * 2``, saving ``extra`` (any kind of tensor) for backward beside ``x``."""

    @staticmethod
    def forward(ctx, x, extra):
        ctx.save_for_backward(x, extra)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        x, extra = ctx.saved_tensors
        assert extra is not None
        return grad * 2, None


def nested(layout: torch.layout) -> torch.Tensor:
    parts = [torch.randn(3, 4), torch.randn(5, 4)]
    return torch.nested.nested_tensor(parts, layout=layout, requires_grad=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_saved_tensors_are_kept_and_gradients_unchanged(layout):
    x, tensors = torch.randn(256, 64, requires_grad=True), nested(layout)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(torch.nn.Identity(), SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = x.sin().sum() + torch.nested.to_padded_tensor(tensors.sin(), 0.0).sum()
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_out > 0  # the plain activation still swaps
    assert torch.equal(x.grad, x.detach().cos())
    pairs = zip(tensors.grad.unbind(), tensors.detach().unbind(), strict=True)
    assert all(torch.equal(grad, value.cos()) for grad, value in pairs)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_quantized_saved_tensor_is_kept_and_gradients_unchanged():
    quantized = torch.quantize_per_tensor(torch.randn(64, 64), 0.1, 0, torch.quint8)
    x = torch.randn(256, 64, requires_grad=True)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(torch.nn.Identity(), SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        y = SavesAlongside.apply(x.sin(), quantized)
    y.sum().backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_out > 0
    assert torch.equal(x.grad, 2 * x.detach().cos())


@pytest.mark.parametrize("schedule", [SwapSchedule.keep_everything(), SwapSchedule.swap_everything()])
def test_in_place_change_of_a_saved_activation_raises_like_plain_pytorch(schedule):
    def step() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(64, 64, requires_grad=True)
        y = x.sigmoid()
        z = y * 2
        y.mul_(3)  # sigmoid's backward needs its output, now changed
        return z.sum(), y  # a swapped one is checked while the changed tensor lives (see the engine)

    with pytest.raises(RuntimeError, match="modified by an inplace operation") as plain:
        step()[0].backward()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(torch.nn.Identity(), schedule):
        loss, _changed = step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as offloaded:
        loss.backward()
    assert "is at version 1; expected version 0 instead" in str(plain.value)
    assert "is at version 1; expected version 0 instead" in str(offloaded.value)
    engine.abort_step()
