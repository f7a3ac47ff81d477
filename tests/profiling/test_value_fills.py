"""A model built for the trace skips in-place value fills: a fake tensor holds no values."""

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.trace import trace_step

FILLS = {"normal_", "uniform_", "zero_", "fill_"}


class _Dispatched(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class _Filled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 32)  # kaiming_uniform_ and uniform_
        self.norm = nn.LayerNorm(32)  # ones_ and zeros_
        self.extra = nn.Parameter(torch.empty(32, 16))
        nn.init.normal_(self.extra, std=0.02)
        self.register_buffer("mask", torch.empty(32).fill_(1.0))
        with torch.no_grad():
            self.extra.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x)) @ self.extra * self.mask[:16]


def test_fills_are_skipped_and_the_model_keeps_its_shapes_and_dtypes():
    dispatched = _Dispatched()

    def build() -> nn.Module:
        with dispatched:
            return _Filled()

    trace = trace_step(build, (8, 64), tracker=LayerTracker())
    assert [name for name in dispatched.names if name in FILLS] == []
    assert "empty" in dispatched.names  # the parameters were still made under the fake mode
    assert trace.param_bytes == 4 * (64 * 32 + 32 + 2 * 32 + 32 * 16)
    assert trace.buffer_bytes == 4 * 32
    assert trace.forward_flops == 2 * 8 * 64 * 32 + 2 * 8 * 32 * 16
