"""A recomputed segment whose inputs the plan swaps: the engine copies them out in forward and
back for the segment's backward, which recomputes from them.

Policy ``"auto"`` takes such a plan for a residual stack below the budget that keeping every
block's input needs, where the link is slow next to the compute (as a GPU's is; the CPU's copies
are fast, so its planner is given a slower link): it trains bitwise as plain training does, every
pass's ledger within the plan's prediction.

Each block of a residual stack is recomputed whole and its layer (the segment's inputs) swapped.
On a simulated GPU whose copies complete late (lags 0, 3, 8 and unbounded): the gradients equal
plain training's in every bit, no stream ordering is violated, the host pool is empty after
each step, every planned step holds at most what its plan predicts, and the plan's swapped bytes
are the blocks' inputs, copied out every planned step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig
from lightning_accudnn.ops import recompute as recompute_module
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.planner.recompute import named_spans, policy_spans
from lightning_accudnn.planner.search import MixedResult
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session import planning as planning_module
from lightning_accudnn.testing import SimulatedGPU
from lightning_accudnn.testing.forced_plans import forced_result
from tests.recompute.recorded_training import assert_bitwise_equal as assert_records_equal
from tests.recompute.recorded_training import cpu_session, train_recorded
from tests.simulated.helpers import (
    PlannedStep,
    assert_bitwise_equal,
    planner_search_replaced,
    train_plain,
    train_session_simulated,
)

WIDTH = 32
CHANNELS = 8
BLOCKS = 4
STEPS = 5


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), *(_Block() for _ in range(BLOCKS)), nn.Linear(WIDTH, 1))


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


BLOCK_NAMES = [str(i) for i in range(1, BLOCKS + 1)]


def _forced_search(profile: StepProfile, cap: int, *args: object, **kwargs: object) -> MixedResult:
    """Every block recomputed whole, each block's layer (its inputs) swapped, the rest kept."""
    spans = [span for span in policy_spans(profile, "recompute") if span.name in BLOCK_NAMES]
    assert sorted(span.name for span in spans) == BLOCK_NAMES

    def swapped(layer: LayerProfile) -> bool:
        return layer.name in BLOCK_NAMES

    return forced_result(profile, spans, swapped)


@pytest.fixture
def forced_plans() -> Iterator[None]:
    with planner_search_replaced(_forced_search):
        yield


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "torch-checkpoint"])
@pytest.mark.parametrize("lag", [0, 3, 8, None])
def test_swapped_inputs_of_recomputed_blocks_train_as_plainly_within_the_prediction(
    forced_plans, lag, lean, monkeypatch
):
    if not lean:  # the segments run under torch.utils.checkpoint, as under a torch function mode
        monkeypatch.setattr(recompute_module, "lean_possible", lambda: False)
    batches = [torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(step)) for step in range(STEPS)]
    for step in _planned_steps_trained_plainly(_model, batches, lag):
        plan = step.plan
        assert sorted(plan.swapped_segments) == BLOCK_NAMES
        assert plan.swapped_layers >= set(BLOCK_NAMES)
        # the blocks' inputs, 16 x 32 float32 each (the first block's input is the stem's
        # output, saved first by that block)
        assert step.stats.bytes_swapped_out == plan.swapped_bytes == BLOCKS * 16 * WIDTH * 4


def _planned_steps_trained_plainly(
    build: Callable[[], nn.Module], batches: list[torch.Tensor], lag: int | None
) -> list[PlannedStep]:
    """The planned steps of a session training ``build()`` on a simulated GPU of ``lag``, once
    checked: at least three, each within its prediction, and the training bitwise plain training's."""
    reference = build()
    model = copy.deepcopy(reference)
    expected = train_plain(reference, batches, _loss)
    config = OffloadConfig(budget=2**30, min_swap_bytes=0, reserve_bytes=0, plan_in_background=False)
    actual, steps = train_session_simulated(model, batches, _loss, SimulatedGPU(lag=lag, seed=0), config)
    assert_bitwise_equal(expected, actual)
    planned = [step for step in steps if not step.stats.profiling]
    assert len(planned) >= 3
    for step in planned:
        assert step.plan.profile.static_bytes + step.peak_held_bytes <= step.stats.predicted_peak_bytes
    return planned


class _ConvBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.conv(x))


def _channels_last() -> nn.Module:
    """The residual stack of convolutions in channels-last memory: each block's input is dense but
    not contiguous, and comes back with its strides for the block's recomputation."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, CHANNELS, 3, padding=1),
        *(_ConvBlock() for _ in range(BLOCKS)),
        nn.Flatten(),
        nn.Linear(CHANNELS * 4 * 4, 1),
    )
    return model.to(memory_format=torch.channels_last)


@pytest.mark.parametrize("lag", [0, None])
def test_swapped_channels_last_inputs_of_recomputed_blocks_train_as_plainly(forced_plans, lag):
    batches = [torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(i)) for i in range(STEPS)]
    for step in _planned_steps_trained_plainly(_channels_last, batches, lag):
        assert sorted(step.plan.swapped_segments) == BLOCK_NAMES
        assert step.stats.bytes_swapped_out == step.plan.swapped_bytes == BLOCKS * 8 * CHANNELS * 4 * 4 * 4


def _stack(blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), *(_Block() for _ in range(blocks)), nn.Linear(WIDTH, 1))


def _slow_link(profile: StepProfile) -> StepProfile:
    """A link slow next to the CPU's compute (1 MB/s), as a GPU's is: recomputing pays there."""
    return dataclasses.replace(profile, d2h_bytes_per_second=1e6, h2d_bytes_per_second=1e6)


def test_auto_swaps_the_inputs_of_the_blocks_it_recomputes_where_the_link_is_slow(monkeypatch):
    blocks = 6

    def batch(step: int) -> torch.Tensor:
        return torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(step))

    profiling = cpu_session(10**9, "auto")
    train_recorded(_stack(blocks), profiling, batch, 2)
    assert profiling.plan is not None
    profile = profiling.plan.profile
    profiling.close()
    activations = profile.unconstrained_peak_bytes - profile.static_bytes
    budget = profile.static_bytes + activations * 3 // 10  # below every block's input kept
    real = planner_plan.plan_swaps

    def slow_link(profile: StepProfile, *args: object, **kwargs: object) -> Plan:
        return real(_slow_link(profile), *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(planning_module, "plan_swaps", slow_link)
    expected, _ = train_recorded(_stack(blocks), None, batch, STEPS)
    session = cpu_session(budget, "auto")
    record, peaks = train_recorded(_stack(blocks), session, batch, STEPS)
    session.close()
    assert_records_equal(record, expected)
    planned = [(plan, ledger) for plan, ledger in peaks if plan is not None]
    assert len(planned) >= 3
    for plan, ledger in planned:
        assert plan.swapped_segments and set(plan.swapped_segments) <= set(plan.recomputed), plan
        assert ledger <= plan.predicted_ledger_peak_bytes <= plan.predicted_peak_bytes <= budget


def _staged() -> nn.Module:
    """A stem, a block kept, a stage of three blocks: the stage's input is the kept block's output."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), _Block(), nn.Sequential(*(_Block() for _ in range(3))), nn.Linear(WIDTH, 1)
    )


def _nested_search(profile: StepProfile, cap: int, *args: object, **kwargs: object) -> MixedResult:
    """The stage recomputed with its blocks recomputed again inside it, the stage's input swapped."""
    (span,) = named_spans(profile, "recompute", ["2", "2.0", "2.1", "2.2"])
    assert span.names == ("2", "2.0", "2.1", "2.2")
    return forced_result(profile, [span], lambda layer: layer.name == "2")


@pytest.mark.parametrize("lag", [0, 8, None])
def test_a_nested_recomputation_s_swapped_input_trains_as_plainly_within_the_prediction(lag):
    batches = [torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(step)) for step in range(STEPS)]
    with planner_search_replaced(_nested_search):
        planned = _planned_steps_trained_plainly(_staged, batches, lag)
    for step in planned:
        assert step.plan.recomputed == ("2", "2.0", "2.1", "2.2") and step.plan.swapped_segments == ("2",)
        assert step.stats.bytes_swapped_out == step.plan.swapped_bytes == 16 * WIDTH * 4
