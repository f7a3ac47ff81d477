"""Property test of the whole loop on a simulated GPU: random models, budgets and lags.

An :class:`~lightning_accudnn.OffloadSession` profiles, plans and runs its plans under a
:class:`~lightning_accudnn.testing.SimulatedGPU`. For every draw: gradients bitwise equal to
plain training, no happens-before violation, the host pool empty after each step, and every
planned step holding at most the memory its plan predicted (static memory plus the
activation bytes the simulated GPU saw held), however late the copies completed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import BudgetTooSmallError, NothingToRecomputeError
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.testing import SimulatedGPU
from tests.models import loss_of
from tests.session_training import measured_pass
from tests.simulated.helpers import assert_bitwise_equal, grads_of, train_plain
from tests.simulated.random_models import PIECES, RandomNet, random_batch

pieces = st.lists(st.sampled_from(sorted(PIECES)), min_size=1, max_size=4)
lags = st.one_of(st.integers(min_value=0, max_value=12), st.none())


def _need(model: torch.nn.Module, batch: object) -> tuple[int, int]:
    """(model state with SGD momentum, saved activations) of one step, as the engine counts them."""
    probe = copy.deepcopy(model)
    stats = measured_pass(probe, lambda module: loss_of(module, batch))
    optimizer = torch.optim.SGD(probe.parameters(), lr=0.05, momentum=0.9)
    return model_state_bytes(probe, [optimizer]), sum(layer.saved_bytes for layer in stats.layers)


@pytest.mark.slow
# Budgets below every plan are refused up front and drawn again (assume): many are, by design.
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    model_pieces=pieces,
    share=st.floats(min_value=0.2, max_value=1.0),
    lag=lags,
    seed=st.integers(0, 2**16),
    policy=st.sampled_from(["auto", "swap", "recompute", "selective"]),
)
# Two views of one output saved as overlapping extents, the older retired from the copy-out FIFO
# while the newer held the storage: it was brought back beside it, 576 B over the prediction.
@example(model_pieces=["gates_in_place", "bf16"], share=0.9375, lag=None, seed=0, policy="auto")
# A model whose plain training diverges to NaN by its third step: offloaded, the same NaNs.
@example(
    model_pieces=["branches", "branches", "branches", "branches"], share=1.0, lag=None, seed=0, policy="auto"
)
def test_planned_steps_stay_within_their_prediction_at_any_lag(model_pieces, share, lag, seed, policy):
    batches = [random_batch(seed + step) for step in range(4)]
    torch.manual_seed(0)
    reference = RandomNet(model_pieces)
    model = copy.deepcopy(reference)
    static, saved = _need(reference, batches[0])
    torch.manual_seed(1)  # the same dropout masks in both trainings
    expected = train_plain(reference, batches, loss_of)
    torch.manual_seed(1)

    gpu = SimulatedGPU(lag=lag, seed=seed)
    session = OffloadSession(
        OffloadConfig(budget=static + int(share * saved), min_swap_bytes=0, policy=policy),
        torch.device("cpu"),
        runtime=gpu,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    actual = []
    for batch in batches:
        optimizer.zero_grad()
        gpu.reset_peaks()
        with session.step(model, optimizer, batch=batch):
            loss = loss_of(model, batch)
        try:
            loss.backward()
        except (BudgetTooSmallError, NothingToRecomputeError):
            assume(False)  # refused up front, before any update: the budget too small, or no segment
        del loss
        stats, plan = session.stats, session.plan
        assert stats is not None and plan is not None
        if not stats.profiling:
            assert plan.profile.static_bytes + gpu.peak_held_bytes <= stats.predicted_peak_bytes
        assert session.engine.pool.in_use_bytes == 0
        actual.append(grads_of(model))
        optimizer.step()
    session.close()
    assert gpu.violations == []
    assert_bitwise_equal(expected, actual)
