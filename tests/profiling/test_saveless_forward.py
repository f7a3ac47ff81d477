"""A traced step's forward with its saves dropped: what a recomputed segment's forward holds, per
layer, against what a real checkpointed forward holds on CPU."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.planner.recompute import named_spans, recomputed_profile, rerun_forward_working_bytes
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step
from lightning_accudnn.testing import OpBytesAllocator
from tests.models import ResidualBlock

BATCH = (8, 8, 16, 16)


def _staged() -> nn.Module:
    torch.manual_seed(0)
    stage = nn.Sequential(*[ResidualBlock(8) for _ in range(4)])
    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), stage, nn.Conv2d(8, 8, 3, padding=1))


class _Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def _checkpointed_forward_held(model: nn.Module) -> int:
    """The most a real CPU step held beyond what it held as the checkpointed stage's forward began,
    while that forward ran (the ops' storages, as the allocator would count them)."""
    allocator = OpBytesAllocator()
    read = allocator.allocated_peak_reader()
    assert read is not None
    model[1] = _Checkpointed(model[1])
    held = []

    def begin(module: nn.Module, args: object) -> None:
        read()  # the peak since here
        held.append(allocator.allocated_bytes)

    def end(module: nn.Module, args: object, output: object) -> None:
        held[-1] = read() - held[-1]

    model[1].register_forward_pre_hook(begin)
    model[1].register_forward_hook(end)
    batch = torch.randn(BATCH)
    with allocator.counting():
        model(batch).mean().backward()
    return held[0]


def test_a_recomputed_stage_s_forward_is_charged_what_its_forward_holds_without_saves_not_its_saves():
    """The stage's four blocks save 16 activations; with its saves dropped its forward holds a block's
    input and a few of its outputs at a time (the trace counts the stage's input too, and the
    planner two layers' saves in flight beside: 7 activations). The bound the planner charges the
    recomputed stage in forward is far below its saves, and at or above what a real checkpointed
    forward held (4 activations)."""
    trace = trace_step(_staged, BATCH, tracker=LayerTracker(), meter=WorkingMemoryMeter)
    profile = trace.to_profile(get_gpu("h100"), min_swap_bytes=0)
    held = dict(profile.swapped_pass_forward_bytes)
    assert set(held) == {layer.name for layer in profile.layers}
    (span,) = named_spans(profile, "recompute", ("1",), ())
    step = recomputed_profile(profile, [span])
    stage = next(layer for layer in step.profile.layers if layer.name == "1")
    saves = rerun_forward_working_bytes(profile.layers[span.first : span.last + 1])
    measured = _checkpointed_forward_held(_staged())
    activation = 8 * 8 * 16 * 16 * 4
    assert measured <= stage.forward_working_bytes <= 7 * activation + 1024 < saves
