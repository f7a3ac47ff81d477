"""Which inputs of a segment a plan may swap when it recomputes the segment whole
(``SegmentProfile.swappable_input_bytes``), as a training session's profiling pass finds them
and as ``accudnn plan``'s trace finds them: the same, for inputs saved inside the segment (yes,
contiguous or channels-last), the batch the step holds (no), an input saved again after the
segment (no), a view of part of a storage (no), an input no op saves (no) and an input a later
block takes too (no).
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step

WIDTH = 16
BATCH = 8
INPUT_BYTES = BATCH * WIDTH * 4
CHANNELS = 8


class _Block(nn.Module):
    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class _Stacked(nn.Module):
    """A stem, then two blocks: each block's input is first saved inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.a = _Block()
        self.b = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(self.stem(x)))


class _OnTheBatch(nn.Module):
    """A block on the batch itself, which the step holds from before the forward to its end."""

    def __init__(self) -> None:
        super().__init__()
        self.a = _Block()
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(x))


class _UsedAfter(nn.Module):
    """A block whose input a multiplication after it saves again."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.a = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.a(h) * h


class _OnAView(nn.Module):
    """A block on the first half of a wider activation: its input is a view of part of a storage."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, 2 * WIDTH)
        self.a = _Block(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.stem(x)[:, :WIDTH])


class _NotSaved(nn.Module):
    """A block whose input no op saves (it is scaled first): the engine never saw it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.a = _ScaledFirst()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.stem(x))


class _ScaledFirst(_Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * 2.0)


class _Joins(nn.Module):
    """A block that joins two activations (a concatenation, which saves neither)."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.mix(torch.cat([x, skip], dim=1))


class _TakenLater(nn.Module):
    """A block whose input a later block takes too (a skip connection), without saving it: that
    block, recomputed, would save it again as its input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.a = _Block()
        self.b = _Joins()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.b(self.a(h), h)


class _ConvBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.conv(x))


class _ChannelsLast(nn.Module):
    """A stem and two blocks of convolutions in channels-last memory (as ``model.to(memory_format=
    torch.channels_last)`` gives): each block's input is dense but not contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(WIDTH // 4, CHANNELS, 1)
        self.a = _ConvBlock()
        self.b = _ConvBlock()
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(self.a(self.stem(x.reshape(-1, WIDTH // 4, 2, 2))))
        assert not h.is_contiguous()
        return h.flatten(1)


CASES = {
    _Stacked: {"a": INPUT_BYTES, "b": INPUT_BYTES},
    _ChannelsLast: {"a": BATCH * CHANNELS * 2 * 2 * 4, "b": BATCH * CHANNELS * 2 * 2 * 4},
    _OnTheBatch: {"a": 0},
    _UsedAfter: {"a": 0},
    _OnAView: {"a": 0},
    _NotSaved: {"a": 0},
    _TakenLater: {"a": 0},
}


def _session_segments(model_class: type[nn.Module]) -> dict[str, tuple[int, int]]:
    torch.manual_seed(0)
    model = model_class()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = OffloadConfig(budget=2**30, min_swap_bytes=0, reserve_bytes=0, plan_in_background=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config, "cpu")
    batch = torch.randn(BATCH, WIDTH)
    with session.step(model, optimizer):
        loss = model(batch).square().mean()
    loss.backward()
    assert session.plan is not None
    segments = session.plan.profile.segments
    session.close()
    return {s.name: (s.swappable_input_bytes, s.swappable_input_storages) for s in segments}


def _traced_segments(model_class: type[nn.Module]) -> dict[str, tuple[int, int]]:
    trace = trace_step(model_class, (BATCH, WIDTH), tracker=LayerTracker())
    profile = trace.to_profile(get_gpu("h100"), optimizer="sgd", min_swap_bytes=0)
    return {s.name: (s.swappable_input_bytes, s.swappable_input_storages) for s in profile.segments}


@pytest.mark.parametrize("model_class", list(CASES), ids=lambda c: c.__name__.strip("_"))
def test_the_session_and_the_trace_find_the_same_swappable_inputs(model_class):
    expected = {name: (nbytes, 1 if nbytes else 0) for name, nbytes in CASES[model_class].items()}
    session = _session_segments(model_class)
    traced = _traced_segments(model_class)
    assert {name: session[name] for name in expected} == expected
    assert {name: traced[name] for name in expected} == expected


def test_the_trace_leaves_out_inputs_below_min_swap_bytes():
    trace = trace_step(_Stacked, (BATCH, WIDTH), tracker=LayerTracker())
    profile = trace.to_profile(get_gpu("h100"), optimizer="sgd", min_swap_bytes=INPUT_BYTES + 1)
    assert {s.name: s.swappable_input_bytes for s in profile.segments} == {"a": 0, "b": 0}


class _FailsAfterTheBlocks(_Stacked):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        super().forward(x)
        raise RuntimeError("the model's own error, after its blocks")


def test_a_failed_profiling_pass_leaves_no_input_held():
    torch.manual_seed(0)
    model = _FailsAfterTheBlocks()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = OffloadConfig(budget=2**30, min_swap_bytes=0, reserve_bytes=0, plan_in_background=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config, "cpu")
    inputs = []
    model.a.register_forward_pre_hook(lambda module, args: inputs.append(weakref.ref(args[0])))
    with pytest.raises(RuntimeError, match="the model's own error"), session.step(model, optimizer):
        model(torch.randn(BATCH, WIDTH))
    gc.collect()
    assert inputs and inputs[0]() is None  # the block's input, which the engine had saved
    session.close()
