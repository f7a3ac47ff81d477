"""A model factory that converts what it built (``Module.to`` a dtype or a memory format), which
fake parameters refuse, still gives the trace a fake model of the converted dtypes and strides,
as does one whose constructor reads the values of tensors it computes; one that moves the model to
a device is told to return it as built."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from lightning_accudnn.profiling.fake_model import build_fake

_REGISTER_PARAMETER = nn.Module.register_parameter


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


class _WidthsFromTensors(nn.Module):
    """Computes its layers' widths with tensors and reads them (as RegNet does): a fake tensor's
    values are unknown, a meta tensor's unreadable."""

    def __init__(self) -> None:
        super().__init__()
        widths = (torch.arange(3) * 8 + 8).tolist()
        self.layers = nn.Sequential(*(nn.Linear(a, b) for a, b in zip([4, *widths], widths, strict=False)))


def test_a_constructor_that_reads_the_tensors_it_computes_is_built_with_fake_parameters():
    fake_mode = FakeTensorMode()
    model = build_fake(_WidthsFromTensors, fake_mode)
    assert [tuple(p.shape) for p in model.parameters()] == [(8, 4), (8,), (16, 8), (16,), (24, 16), (24,)]
    assert all(isinstance(p, FakeTensor) and p.fake_mode is fake_mode for p in model.parameters())
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    assert nn.Module.register_parameter is _REGISTER_PARAMETER  # put back


def test_a_factory_that_moves_the_model_to_a_device_is_told_to_return_it_as_built():
    with pytest.raises(RuntimeError, match="moves the model to a device"):
        build_fake(lambda: _convolutions().to("cpu"), FakeTensorMode())


def test_other_errors_of_the_factory_are_raised_as_they_are():
    def broken() -> nn.Module:
        raise RuntimeError("the factory's own error")

    with pytest.raises(RuntimeError, match="the factory's own error"):
        build_fake(broken, FakeTensorMode())
