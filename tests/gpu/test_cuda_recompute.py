"""On a CUDA GPU: whole segments recomputed through the lean checkpoint (their inputs swapped
too) train bitwise like the plain loop, with CUDA dropout (its device RNG state replayed) and bf16
CUDA autocast (its state replayed), in a session whose steady passes run without the engine's
hooks; the passes replayed under the plan time its recomputations with CUDA events."""

import pytest

from lightning_accudnn import OffloadConfig
from lightning_accudnn.ops import recompute as recompute_module
from lightning_accudnn.planner import plan as planner_plan
from tests.recompute.models import forcing_search
from tests.recompute.recorded_training import assert_bitwise_equal
from tests.recompute.training import plain, train

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("deterministic_cuda")]


@pytest.mark.parametrize(
    ("kind", "names"), [("resnet", ("blocks.0", "blocks.2")), ("gpt", ("blocks.0", "blocks.1.mlp"))]
)
@pytest.mark.parametrize("autocast", [False, True])
def test_lean_recomputation_trains_bitwise_on_cuda(kind, names, autocast, monkeypatch):
    def torch_checkpoint(*args, **kwargs):
        raise AssertionError("a whole segment took torch.utils.checkpoint, not the lean checkpoint")

    monkeypatch.setattr(recompute_module, "checkpoint", torch_checkpoint)
    monkeypatch.setattr(planner_plan, "search_mixed", forcing_search(names))
    config = OffloadConfig(
        budget=10**10, min_swap_bytes=0, reserve_bytes=0, policy="recompute", observe_every=2
    )
    expected = plain(kind, "cuda", autocast)
    record, plans, _, _, session = train(kind, config, device="cuda", autocast=autocast)
    assert_bitwise_equal(record, expected)
    assert all(sorted(plan.recomputed) == sorted(names) for plan in plans)  # every pass after profiling
    # The replayed passes timed each recomputation with CUDA events, read at each pass's end.
    assert session.stats.recompute_cost_ratio is not None and not session.stats.steady_timing


def _forced_training(names, swapped, autocast, monkeypatch):  # type: ignore[no-untyped-def]
    """Train the ResNet on CUDA under the plan recomputing ``names`` and swapping ``swapped``:
    the plain loop's record, the session's, its plans, and per step (observed, bytes swapped out)."""
    monkeypatch.setattr(planner_plan, "search_mixed", forcing_search(names, swapped))
    config = OffloadConfig(budget=10**10, min_swap_bytes=0, reserve_bytes=0, policy="recompute")
    passes = []
    expected = plain("resnet", "cuda", autocast)
    record, plans, _, _, _ = train(
        "resnet",
        config,
        device="cuda",
        autocast=autocast,
        after_step=lambda session: passes.append((session.stats.observed, session.stats.bytes_swapped_out)),
    )
    return expected, record, plans, passes


@pytest.mark.parametrize("autocast", [False, True])
def test_recomputing_and_swapping_on_cuda_drops_the_hooks_after_the_last_swap_and_trains_bitwise(
    autocast, monkeypatch
):
    """Two blocks recomputed whole and a layer between them swapped: the steady passes between
    observed ones swap on the copy stream, take the engine's hooks out after the swapped layer
    and recompute the later block with none, and training is bitwise the plain loop's."""
    swapped = ("blocks.1.bn1", "blocks.1.relu")
    expected, record, plans, passes = _forced_training(
        ("blocks.0", "blocks.2"), swapped, autocast, monkeypatch
    )
    assert_bitwise_equal(record, expected)
    assert all(plan.swapped_layers == frozenset(swapped) for plan in plans[1:])
    assert any(not observed and swapped_out > 0 for observed, swapped_out in passes[1:]), passes


@pytest.mark.parametrize("autocast", [False, True])
def test_swapping_the_inputs_of_recomputed_blocks_on_cuda_trains_bitwise(autocast, monkeypatch):
    """Three blocks recomputed whole with their layers (their inputs) swapped: the second and third
    blocks' inputs, which no kept layer saves, go out on the copy stream as each block starts and
    come back for its recomputation, in observed passes and in those between; training is bitwise
    the plain loop's."""
    names = ("blocks.0", "blocks.1", "blocks.2")
    expected, record, plans, passes = _forced_training(names, names, autocast, monkeypatch)
    assert_bitwise_equal(record, expected)
    assert all(plan.swapped_segments == ("blocks.1", "blocks.2") for plan in plans[1:])
    assert all(swapped_out == plans[-1].swapped_bytes > 0 for _, swapped_out in passes[1:]), passes
    assert any(not observed for observed, _ in passes[1:]), passes
