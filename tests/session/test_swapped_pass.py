"""What a session's profiling pass held at each forward level, kept for the plans of its pass kind:
a recomputed segment's forward holds no more
(:func:`~lightning_accudnn.planner.recompute.swapped_pass_forward_bound`)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn.ops import StepStats
from lightning_accudnn.ops.recomputation_scope import scratch_statistics_bytes
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session.pass_records import PassRecords
from lightning_accudnn.session.plan_book import PassKey
from tests.models import ResidualBlock
from tests.session.helpers import run_counted

KEY = PassKey(model=1, batch=(), position=0)


def _records() -> PassRecords:
    return PassRecords(torch.device("cpu"), min_swap_bytes=0, observe_every=2)


def _profile(static_bytes: int = 1_000, working: int = 30) -> StepProfile:
    layers = (
        LayerProfile("a", 100, 100, forward_working_bytes=working, retired_alive_bytes=20),
        LayerProfile("b", 50, 40, forward_working_bytes=-5),
    )
    return StepProfile(layers, static_bytes)


def _pass(swapped_out: int) -> StepStats:
    return StepStats(swapped_out, 0, 0.0, 0, 1, 0.0, 0.0, layers=())


def test_the_profiling_pass_s_working_memory_and_retired_storages_are_listed_for_the_pass_kind():
    records = _records()
    records.note_swapped_pass(KEY, _pass(140), _profile())
    later = records.with_swapped_pass(KEY, _profile(working=0))
    assert later.swapped_pass_forward_bytes == (("a", 50), ("b", -5))
    other = PassKey(model=1, batch=(), position=1)
    assert records.with_swapped_pass(other, _profile()).swapped_pass_forward_bytes == ()


def test_what_the_pass_held_is_measured_against_the_model_state_counted_now():
    """Model state found since (autocast's weight copies) was in the pass's working memory."""
    records = _records()
    records.note_swapped_pass(KEY, _pass(140), _profile(static_bytes=1_000))
    moved = records.with_swapped_pass(KEY, _profile(static_bytes=1_010))
    assert moved.swapped_pass_forward_bytes == (("a", 40), ("b", -15))


def test_nothing_is_listed_from_a_pass_that_kept_swappable_bytes_or_measured_no_working_memory():
    records = _records()
    records.note_swapped_pass(KEY, _pass(139), _profile())  # 1 byte kept for want of host memory
    assert records.with_swapped_pass(KEY, _profile()).swapped_pass_forward_bytes == ()
    records.note_swapped_pass(KEY, _pass(140), _profile())
    unmeasured = StepProfile(tuple(LayerProfile(n, 10, 10) for n in "ab"), 1_000)
    assert records.with_swapped_pass(KEY, unmeasured) is unmeasured
    records.note_swapped_pass(KEY, _pass(20), unmeasured)  # a CPU session with no allocator
    assert records.with_swapped_pass(KEY, _profile()).swapped_pass_forward_bytes == ()


def test_a_graph_that_changed_forgets_it():
    records = _records()
    records.note_swapped_pass(KEY, _pass(140), _profile())
    records.forget_sequence(KEY)
    assert records.with_swapped_pass(KEY, _profile()).swapped_pass_forward_bytes == ()


def _staged() -> nn.Module:
    torch.manual_seed(0)
    stages = [nn.Sequential(*[ResidualBlock(8) for _ in range(6)]) for _ in range(2)]
    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), *stages, nn.Conv2d(8, 8, 3, padding=1))


def _images(step: int) -> torch.Tensor:
    return torch.randn(8, 8, 16, 16, generator=torch.Generator().manual_seed(step))


def _square_mean(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def test_a_stage_recomputed_around_its_recomputed_blocks_is_charged_in_forward_what_the_profiling_pass_held():
    """Two stages of six residual blocks, keep-or-recompute at a third of the peak with everything
    kept: only a stage recomputed with its blocks recomputed again inside it fits. Its forward,
    which saves nothing, holds what the profiling pass held at its layers (a block's input and a
    few of its outputs), not all it saves, and no step holds more than predicted."""
    kept, _ = run_counted(
        _staged(), _images, _square_mean, 3, budget="100%", reserve_bytes=0, min_swap_bytes=0
    )
    seen, plan = run_counted(
        _staged(),
        _images,
        _square_mean,
        4,
        budget=int(kept[-1].peak / 3),
        reserve_bytes=0,
        min_swap_bytes=0,
        policy="recompute",
    )
    assert "1" in plan.recomputed and "1.0" in plan.recomputed
    assert plan.profile.swapped_pass_forward_bytes
    planned = [step for step in seen if step.predicted is not None]
    assert planned and all(step.peak <= step.predicted for step in planned)


def test_the_scratch_statistics_of_recomputed_norms_are_model_state():
    """A recomputed block's BatchNorms update scratch statistics, made at the first recomputation
    and kept, one copy per recomputed segment a norm is in: the model state counts them from the
    start (under a policy that may recompute), so no pass after the first recomputation holds
    them above its prediction."""
    kept, _ = run_counted(  # a policy that never recomputes counts no scratch statistics
        _staged(),
        _wide_images,
        _square_mean,
        3,
        budget="100%",
        reserve_bytes=0,
        min_swap_bytes=0,
        policy="swap",
    )
    seen, plan = run_counted(
        _staged(),
        _wide_images,
        _square_mean,
        5,
        budget=int(0.7 * kept[-1].peak),
        reserve_bytes=0,
        min_swap_bytes=0,
        policy="recompute",
    )
    assert plan.recomputed
    scratch = scratch_statistics_bytes(_staged())
    # 24 norms (two 8-channel float statistics and a count each), a copy each for the segments
    # a norm such as "1.0.bn1" may be recomputed in: itself, its block and its stage.
    assert scratch == 3 * 24 * (2 * 8 * 4 + 8)
    assert plan.profile.static_bytes - kept[-1].profile.static_bytes == scratch
    planned = [step for step in seen if step.predicted is not None]
    assert all(step.peak <= step.predicted for step in planned)


def _wide_images(step: int) -> torch.Tensor:
    return torch.randn(16, 8, 32, 32, generator=torch.Generator().manual_seed(step))
