"""ShapePlanner on synthetic profiles: which plan a new batch shape gets (reused, scaled or
none), and the tuner's batch-size predictions agree with the session's scaling."""

from __future__ import annotations

import pytest
import torch

from lightning_accudnn.callbacks.prediction import predict_batch_sizes
from lightning_accudnn.planner.plan import BudgetTooSmallError, plan_swaps
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource
from lightning_accudnn.session.shapes import COVER_SHARE, ShapePlanner

BUDGET = 3_200


def _key(batch: int, length: int, dtype: torch.dtype = torch.int64, position: int = 0) -> PassKey:
    return PassKey(model=1, batch=(((batch, length), dtype),), position=position)


def _profile(scale: float = 1.0) -> StepProfile:
    layers = tuple(
        LayerProfile(f"block{i}", int(1_000 * scale), int(1_000 * scale), 1e-3, 2e-3) for i in range(4)
    )
    return StepProfile(layers, static_bytes=0)


def _planner(book: PlanBook, budget: int = BUDGET) -> tuple[ShapePlanner, list[StepProfile]]:
    asked: list[StepProfile] = []

    def make_plan(profile: StepProfile, key: PassKey):
        asked.append(profile)
        return plan_swaps(profile, budget)

    return ShapePlanner(book, make_plan), asked


def test_a_shorter_shape_reuses_the_smallest_covering_plan_without_the_planner():
    book = PlanBook()
    long, longer = plan_swaps(_profile(), BUDGET), plan_swaps(_profile(1.5), BUDGET)
    book.keep(_key(8, 64), long, PlanSource.REFINED)
    book.keep(_key(8, 96), longer, PlanSource.REFINED)
    shapes, asked = _planner(book)

    assert shapes.plan_for(_key(8, 48), static_bytes=0) is long  # 64 covers it, and is smaller than 96
    assert book.source(_key(8, 48)) is PlanSource.COVERED and asked == []
    assert shapes.plan_for(_key(8, 80), static_bytes=0) is longer


def test_a_shape_under_the_cover_share_gets_a_plan_of_its_own_from_the_tightest_scaled_profile():
    book = PlanBook()
    book.keep(_key(8, 64), plan_swaps(_profile(), BUDGET), PlanSource.REFINED)
    book.keep(_key(8, 20), plan_swaps(_profile(0.3), BUDGET), PlanSource.REFINED)
    shapes, asked = _planner(book)
    length = 24  # under COVER_SHARE of 64: not 64's plan; 20's does not cover a longer length
    assert length / 64 < COVER_SHARE

    plan = shapes.plan_for(_key(8, length), static_bytes=0)
    assert book.source(_key(8, length)) is PlanSource.SCALED and len(asked) == 1
    # From 20 (grown as (24/20)**2, the bound for layers of unknown growth), not 64 (not shrunk).
    assert [layer.saved_bytes for layer in plan.profile.layers] == [432] * 4
    assert book.needs_refining(_key(8, length))


def test_a_longer_shape_is_scaled_with_the_bound_and_keeps_the_measured_link_and_todays_static_memory():
    book = PlanBook()
    profile = StepProfile(
        _profile().layers, static_bytes=100, d2h_bytes_per_second=5e9, h2d_bytes_per_second=6e9
    )
    book.keep(_key(8, 32), plan_swaps(profile, BUDGET), PlanSource.PROFILED)
    shapes, asked = _planner(book, budget=10_000)

    plan = shapes.plan_for(_key(4, 64), static_bytes=300)  # half the batch, twice the length
    assert [layer.saved_bytes for layer in plan.profile.layers] == [2_000] * 4  # 0.5 * 2**2
    assert plan.profile.static_bytes == 300
    assert (plan.profile.d2h_bytes_per_second, plan.profile.h2d_bytes_per_second) == (5e9, 6e9)


@pytest.mark.parametrize(
    "other", [_key(8, 32, dtype=torch.float32), _key(8, 32, position=1), PassKey(2, _key(8, 32).batch, 0)]
)
def test_another_pass_is_not_planned_from(other):
    book = PlanBook()
    book.keep(_key(8, 64), plan_swaps(_profile(), BUDGET), PlanSource.REFINED)
    shapes, _ = _planner(book)
    assert shapes.plan_for(other, static_bytes=0) is None
    assert book.plan(other) is None


def test_no_plan_fitting_the_scaled_bound_means_the_pass_profiles():
    book = PlanBook()
    book.keep(_key(8, 16), plan_swaps(_profile(), BUDGET), PlanSource.REFINED)
    shapes, asked = _planner(book)
    # Length 128 counted at (128/16)**2 = 64 times the bytes: no plan fits the budget.
    with pytest.raises(BudgetTooSmallError):
        plan_swaps(_profile(64), BUDGET)
    assert shapes.plan_for(_key(8, 128), static_bytes=0) is None
    assert len(asked) == 1 and book.plan(_key(8, 128)) is None


def test_a_reused_plan_departs_when_its_own_layers_or_peak_do_not_hold():
    book = PlanBook()
    book.keep(_key(8, 64), plan_swaps(_profile(), BUDGET), PlanSource.REFINED)
    shapes, _ = _planner(book)
    shapes.plan_for(_key(8, 40), static_bytes=0)
    assert book.source(_key(8, 40)) is PlanSource.COVERED

    assert not book.departs(_key(8, 40), _profile(40 / 64))  # measured: smaller, same layers
    assert book.departs(_key(8, 40), _profile(1.2))  # measured more than the plan was made for
    other = StepProfile((*_profile(0.5).layers, LayerProfile("branch", 10, 10)), static_bytes=0)
    assert book.departs(_key(8, 40), other)  # a layer the plan does not know


def test_the_tuners_batch_size_predictions_use_the_sessions_scaling():
    profile = StepProfile(
        tuple(LayerProfile(f"l{i}", 1_000 + 100 * i, 900, 1e-3, 2e-3) for i in range(5)), static_bytes=2_000
    )
    budget = 2_000 + 8_000
    predictions = predict_batch_sizes(profile, 8, None, [12, 16], budget)

    for size in (12, 16):
        book = PlanBook()
        book.keep(_key(8, 32), plan_swaps(profile, budget), PlanSource.REFINED)
        shapes, asked = _planner(book, budget=budget)
        plan = shapes.plan_for(_key(size, 32), static_bytes=2_000)
        assert book.source(_key(size, 32)) is PlanSource.SCALED
        assert plan.profile == asked[0]
        assert predictions[size].feasible and plan.swapped_layers
        assert plan.predicted_peak_bytes == predictions[size].peak_bytes
        assert plan.predicted_step_seconds == pytest.approx(predictions[size].seconds_per_batch)
