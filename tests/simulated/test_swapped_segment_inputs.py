"""Property test of plans that swap recomputed segments' inputs, on a simulated GPU: random
models, lags and seeds.

The planner's search is replaced by one that recomputes every innermost segment whole and swaps
each one's layer (its inputs) where the profile says the engine may, keeping every other layer:
the plan the search would take only where the link is slow, forced here on every model. For
every draw: gradients bitwise equal to plain training, no happens-before violation, the host
pool empty after each step, every planned step holding at most the memory its plan predicted,
and the plan's inputs copied out.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_accudnn import OffloadConfig
from lightning_accudnn.planner.recompute import SegmentSpan, policy_spans
from lightning_accudnn.planner.search import MixedResult
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.testing import SimulatedGPU
from lightning_accudnn.testing.forced_plans import forced_result
from tests.models import loss_of
from tests.simulated.helpers import (
    assert_bitwise_equal,
    planner_search_replaced,
    train_plain,
    train_session_simulated,
)
from tests.simulated.random_models import PIECES, RandomNet, random_batch

pieces = st.lists(st.sampled_from(sorted(PIECES)), min_size=1, max_size=4)
lags = st.one_of(st.integers(min_value=0, max_value=12), st.none())


def _innermost(spans: tuple[SegmentSpan, ...]) -> list[SegmentSpan]:
    """The spans holding no other span (they never overlap one another)."""
    return [span for span in spans if not any(other is not span and span.holds(other) for other in spans)]


def _forced_search(profile: StepProfile, cap: int, *args: object, **kwargs: object) -> MixedResult:
    spans = _innermost(policy_spans(profile, "recompute"))
    names = {span.name for span in spans}

    def swapped(layer: LayerProfile) -> bool:
        return layer.name in names

    return forced_result(profile, spans, swapped)


@pytest.fixture
def forced_plans() -> Iterator[None]:
    with planner_search_replaced(_forced_search):
        yield


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(model_pieces=pieces, lag=lags, seed=st.integers(0, 2**16))
def test_swapped_inputs_of_recomputed_segments_train_as_plainly_within_the_prediction(
    forced_plans, model_pieces, lag, seed
):
    batches = [random_batch(seed + step) for step in range(4)]
    torch.manual_seed(0)
    reference = RandomNet(model_pieces)
    model = copy.deepcopy(reference)
    torch.manual_seed(1)  # the same dropout masks in both trainings
    expected = train_plain(reference, batches, loss_of)
    torch.manual_seed(1)

    config = OffloadConfig(budget=2**30, min_swap_bytes=0, reserve_bytes=0, plan_in_background=False)
    actual, steps = train_session_simulated(model, batches, loss_of, SimulatedGPU(lag=lag, seed=seed), config)
    for step in steps:
        if not step.stats.profiling:
            assert step.plan.profile.static_bytes + step.peak_held_bytes <= step.stats.predicted_peak_bytes
            if step.stats.observed:
                assert step.stats.bytes_swapped_out >= step.plan.swapped_bytes
    assert_bitwise_equal(expected, actual)
