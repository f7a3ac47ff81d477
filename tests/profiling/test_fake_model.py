"""A model factory that converts what it built (``Module.to`` a dtype or a memory format), which
fake parameters refuse, still gives the trace a fake model of the converted dtypes and strides;
one that moves it to a device is told to return it as built."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from lightning_accudnn.profiling.fake_model import build_fake


def _convolutions() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 3))


@pytest.mark.parametrize(
    ("convert", "dtype", "channels_last"),
    [
        (lambda model: model.to(torch.bfloat16), torch.bfloat16, False),
        (lambda model: model.half(), torch.float16, False),
        (lambda model: model.to(memory_format=torch.channels_last), torch.float32, True),
    ],
    ids=["to-bf16", "half", "channels-last"],
)
def test_a_converted_model_is_built_fake_as_converted(convert, dtype, channels_last):
    fake_mode = FakeTensorMode()
    model = build_fake(lambda: convert(_convolutions()), fake_mode)
    weights = [module.weight for module in model if isinstance(module, nn.Conv2d)]
    for tensor in (*model.parameters(), *model.buffers()):
        assert isinstance(tensor, FakeTensor) and tensor.fake_mode is fake_mode
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert all(w.is_contiguous(memory_format=torch.channels_last) == channels_last for w in weights)
    assert all(w.is_contiguous() != channels_last for w in weights)


def test_a_factory_that_moves_the_model_to_a_device_is_told_to_return_it_as_built():
    with pytest.raises(RuntimeError, match="moves the model to a device"):
        build_fake(lambda: _convolutions().to("cpu"), FakeTensorMode())


def test_other_errors_of_the_factory_are_raised_as_they_are():
    def broken() -> nn.Module:
        raise RuntimeError("the factory's own error")

    with pytest.raises(RuntimeError, match="the factory's own error"):
        build_fake(broken, FakeTensorMode())
