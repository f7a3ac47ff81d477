"""Training with recomputed segments is training: bitwise-equal gradients, weights and buffers.

Every budget here is at least the profiling pass's peak (no plan's budget is below it), so every
pass, the profiling one included, stays within it. Policy ``"recompute"`` (keep or recompute)
forces recomputation; ``"auto"`` recomputes where it is predicted faster, which a slow host link
(:func:`tests.recompute.models.slow_link`) makes it.
"""

from __future__ import annotations

import pytest
import torch

from lightning_accudnn import OffloadConfig
from lightning_accudnn.planner.plan import min_budget_bytes, swap_everything_peak_bytes
from lightning_accudnn.testing import SimulatedGPU
from tests.recompute.models import slow_link
from tests.recompute.training import measured_profile, plain, train

# Under auto, min_swap_bytes and keep_on_device only keep the planner's search small (few swappable
# layers: the tests' run time); the recompute policy never swaps.
CASES = [
    ("resnet", "recompute", 0, ()),
    ("resnet", "auto", 20_000, ("blocks.2.*",)),
    ("gpt", "recompute", 0, ()),
    ("gpt", "auto", 30_000, ()),
    ("checkpointed", "recompute", 0, ()),
    ("checkpointed", "auto", 0, ()),
]


@pytest.mark.parametrize(("kind", "policy", "min_swap_bytes", "keep_on_device"), CASES)
def test_recomputed_training_is_bitwise_plain_training(
    kind, policy, min_swap_bytes, keep_on_device, monkeypatch
):
    slow_link(monkeypatch)  # swapping is slow: auto recomputes where recomputation fits
    config = OffloadConfig(
        budget=10**9,
        min_swap_bytes=min_swap_bytes,
        keep_on_device=keep_on_device,
        reserve_bytes=0,
        policy=policy,
    )
    profile = measured_profile(kind, config)
    # The least budget at which keeping or recomputing fits (never below the profiling pass's peak).
    budget = min_budget_bytes(profile, policy="recompute")
    assert swap_everything_peak_bytes(profile) <= budget < profile.unconstrained_peak_bytes
    expected = plain(kind)
    record, plans, hooked, peaks, _ = train(kind, config.replace(budget=budget))
    for step, (got, want) in enumerate(zip(record, expected, strict=True)):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (kind, policy, step, name)
    final = plans[-1]
    assert final is not None and final.recomputed
    if policy == "auto":  # copies at 1 KB/s cost seconds, recomputation milliseconds
        assert not final.swapped_layers
    # Within the budget: the engine's ledger in every pass, the profiling pass included.
    assert peaks[0][0] and all(peak <= budget for _, peak in peaks), (peaks, budget)
    # Once the plan is made and its sequence recorded, no more hooked (profiling) passes.
    assert hooked[-2:] == [0, 0], hooked
    assert all(plan is final for plan in plans[-2:])


def test_a_user_checkpointed_block_is_never_recomputed_again():
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="recompute")
    profile = measured_profile("checkpointed", config)
    names = {segment.name for segment in profile.segments}
    assert "checkpointed" not in names and not any(name.startswith("checkpointed.") for name in names)
    assert {"stem", "plain.0", "plain.1"} <= names


@pytest.mark.parametrize("lag", [0, 2, None])
def test_recomputation_on_a_simulated_gpu_keeps_order_and_the_budget(lag):
    """The residual CNN recomputing (policy "recompute") on a simulated GPU whose allocator is
    capped at what the budget leaves beside the model state: no out-of-memory in any pass,
    the profiling pass included, no stream-order violation, bitwise plain training."""
    reserve = 16 * 1024  # the allocator rounds blocks to 512 bytes: the reserve covers it
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=reserve, policy="recompute")
    profile = measured_profile("resnet", config, runtime=SimulatedGPU(lag=lag))
    budget = min_budget_bytes(profile, reserve, policy="recompute")
    assert budget < profile.unconstrained_peak_bytes  # only recomputation makes it fit
    gpu = SimulatedGPU(lag=lag, capacity_bytes=budget - profile.static_bytes)
    expected = plain("resnet")
    record, plans, _, peaks, _ = train("resnet", config.replace(budget=budget), runtime=gpu)
    for got, want in zip(record, expected, strict=True):
        assert all(torch.equal(got[name], want[name]) for name in want)
    assert plans[-1].recomputed
    assert gpu.violations == [] and gpu.num_ooms == 0
    assert all(peak <= budget for _, peak in peaks)
    assert gpu.peak_bytes <= budget - profile.static_bytes
