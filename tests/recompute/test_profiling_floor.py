"""A budget named as the smallest that works, works on every run, the profiling pass included.

The profiling pass (the first pass of a new batch shape) swaps every activation it can and
recomputes none, so under policy "auto" a budget that only recomputation would fit is refused
before any weight changes, naming the profiling pass's peak; that budget then trains with every
pass within it, on a simulated GPU whose allocator is capped at what the budget leaves.

The transformer block with dropout and SDPA, with only storages of 30 kB or more swappable: there
recomputing lowers the least peak below what swapping everything reaches.
"""

from __future__ import annotations

import functools
import itertools
import warnings

import pytest
import torch

from lightning_accudnn import BudgetTooSmallError, OffloadConfig, OffloadSession
from lightning_accudnn.planner import PlanChoice, Simulator, StepProfile, min_budget_bytes
from lightning_accudnn.planner.plan import swap_everything_peak_bytes
from lightning_accudnn.planner.recompute import candidate_spans, recomputed_profile
from lightning_accudnn.testing import SimulatedGPU
from tests.recompute.models import batch, build, loss_of
from tests.recompute.training import plain, profiled, train

RESERVE = 16 * 1024  # the simulated allocator rounds blocks to 512 bytes: the reserve covers it
CONFIG = OffloadConfig(budget=10**9, min_swap_bytes=30_000, reserve_bytes=RESERVE, policy="auto")


@functools.cache
def _profiled() -> tuple[StepProfile, int]:
    return profiled("gpt", CONFIG)


def _least_peak_with_recomputation(profile: StepProfile) -> int:
    """The least predicted peak of any plan that recomputes or swaps (every swappable layer
    swapped, limit and window 0), written with the simulator, without the planner's search."""
    spans = candidate_spans(profile)
    peaks = []
    for count in range(len(spans) + 1):
        for chosen in itertools.combinations(spans, count):
            if any(a.overlaps(b) for a, b in itertools.combinations(chosen, 2)):
                continue
            step = recomputed_profile(profile, chosen)
            simulator = Simulator(step.profile, step.transient_bytes)
            peaks.append(simulator.peak_bytes(PlanChoice(simulator.swap_everything(), 0, 0)))
    return min(peaks)


def _floor() -> int:
    """The smallest budget: the profiling pass's measured peak (within the computed one, which
    assumes the worst split of layers into storages), above any plan's least peak, plus the reserve."""
    profile, profiling_peak = _profiled()
    assert _least_peak_with_recomputation(profile) < profiling_peak <= swap_everything_peak_bytes(profile)
    assert min_budget_bytes(profile, RESERVE, policy="auto") == swap_everything_peak_bytes(profile) + RESERVE
    return min_budget_bytes(profile, RESERVE, policy="auto", profiling_peak_bytes=profiling_peak)


def test_a_budget_only_recomputation_fits_is_refused_before_any_update_naming_the_profiling_floor():
    profile, floor = _profiled()[0], _floor()
    recomputing = _least_peak_with_recomputation(profile) + RESERVE  # the smallest budget named before
    assert recomputing < floor
    budget = (recomputing + floor) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(CONFIG.replace(budget=budget), "cpu")
    model = build("gpt")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(BudgetTooSmallError, match="first pass of a new batch shape") as raised:
        with session.step(model, optimizer):
            loss = loss_of(model, *batch("gpt", 0))
        loss.backward()
        optimizer.step()
    session.close()
    assert raised.value.min_budget_bytes == floor and raised.value.profiling_binds
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())
    assert not optimizer.state, "the optimizer never stepped"


@pytest.mark.parametrize("lag", [0, 2, None])
def test_the_named_floor_trains_every_pass_within_it_on_a_capped_simulated_gpu(lag):
    profile, floor = _profiled()[0], _floor()
    gpu = SimulatedGPU(lag=lag, capacity_bytes=floor - profile.static_bytes)
    record, plans, _, peaks, session = train("gpt", CONFIG.replace(budget=floor), runtime=gpu)
    assert peaks[0][0], "the first pass profiles"
    assert all(peak <= floor for _, peak in peaks), (peaks, floor)
    assert gpu.num_ooms == 0 and gpu.violations == []
    assert gpu.peak_bytes <= floor - profile.static_bytes
    assert plans[-1] is not None and plans[-1].min_budget_bytes == floor
    for step, (got, want) in enumerate(zip(record, plain("gpt"), strict=True)):
        assert all(torch.equal(got[name], want[name]) for name in want), step
