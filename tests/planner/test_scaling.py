"""A profile carried to another batch shape: bounds, measured bytes, growth, reuse."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.planner import LayerProfile, StepProfile, plan_swaps
from lightning_accudnn.planner.plan import BudgetTooSmallError
from lightning_accudnn.planner.scaling import ShapeRatio, fit_growth, plan_covers, scale_profile, shape_ratio
from lightning_accudnn.planner.timeline import PlanChoice, Simulator
from tests.planner.strategies import profiles

_exponents = st.sampled_from([0.0, 1.0, 2.0])
_ratios = st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0])


def _true_shape(profile: StepProfile, ratio: ShapeRatio, exponents: list[float]) -> StepProfile:
    """What the pass really saves at the new shape when layer i grows as ``extent ** g_i``."""
    layers = []
    for layer, g in zip(profile.layers, exponents, strict=True):
        factor = ratio.batch * ratio.extent**g
        saved = math.floor(layer.saved_bytes * factor)
        layers.append(LayerProfile(layer.name, saved, min(saved, math.floor(layer.swappable_bytes * factor))))
    return StepProfile(tuple(layers), profile.static_bytes)


@settings(max_examples=200, deadline=None)
@given(profiles(max_layers=8), _ratios, _ratios, st.data())
def test_unknown_growth_never_undercounts_a_layer_growing_at_most_quadratically(profile, batch, extent, data):
    exponents = [data.draw(_exponents) for _ in profile.layers]
    ratio = ShapeRatio(batch, extent)
    truth = _true_shape(profile, ratio, exponents)
    scaled = scale_profile(profile, ratio)
    for real, estimate in zip(truth.layers, scaled.layers, strict=True):
        assert real.saved_bytes <= estimate.saved_bytes
        assert real.swappable_bytes <= estimate.swappable_bytes
    # With the exponents known, the estimate is the truth (up to the rounding up).
    known = scale_profile(profile, ratio, growth=exponents)
    for real, estimate in zip(truth.layers, known.layers, strict=True):
        assert 0 <= estimate.saved_bytes - real.saved_bytes <= 1


@settings(max_examples=100, deadline=None)
@given(profiles(max_layers=8))
def test_the_same_shape_is_the_same_profile(profile):
    assert scale_profile(profile, ShapeRatio(1.0, 1.0)) == StepProfile(
        tuple(
            LayerProfile(
                layer.name,
                layer.saved_bytes,
                layer.swappable_bytes,
                layer.forward_seconds,
                layer.backward_seconds,
            )
            for layer in profile.layers
        ),
        profile.static_bytes,
        profile.d2h_bytes_per_second,
        profile.h2d_bytes_per_second,
    )


def test_times_follow_the_work_and_the_link_and_static_memory_stay():
    profile = StepProfile(
        (LayerProfile("proj", 100, 100, 1.0, 2.0), LayerProfile("attn", 100, 100, 1.0, 1.0)),
        static_bytes=500,
        d2h_bytes_per_second=10.0,
        h2d_bytes_per_second=20.0,
    )
    scaled = scale_profile(profile, ShapeRatio(2.0, 3.0), growth=[1.0, 2.0])
    assert [(layer.forward_seconds, layer.backward_seconds) for layer in scaled.layers] == [
        (6.0, 12.0),
        (18.0, 18.0),
    ]
    assert (scaled.static_bytes, scaled.d2h_bytes_per_second, scaled.h2d_bytes_per_second) == (
        500,
        10.0,
        20.0,
    )
    # Unknown exponents: bytes bounded (quadratic), time estimated as linear.
    unknown = scale_profile(profile, ShapeRatio(1.0, 3.0))
    assert [layer.saved_bytes for layer in unknown.layers] == [900, 900]
    assert [layer.forward_seconds for layer in unknown.layers] == [3.0, 3.0]


def test_measured_bytes_are_taken_as_they_are_and_times_follow_each_layers_bytes():
    profile = StepProfile(
        (
            LayerProfile("a", 100, 100, 1.0, 2.0),
            LayerProfile("b", 0, 0, 1.0, 1.0),
            LayerProfile("c", 100, 60, 1.0, 1.0),
        ),
        static_bytes=7,
    )
    measured = (
        LayerProfile("a", 300, 250),
        LayerProfile("b", 0, 0),
        LayerProfile("c", 50, 0, small_storages=(50,)),
    )
    scaled = scale_profile(profile, ShapeRatio(1.0, 2.0), measured=measured)
    assert [(layer.saved_bytes, layer.swappable_bytes) for layer in scaled.layers] == [
        (300, 250),
        (0, 0),
        (50, 0),
    ]
    assert scaled.layers[2].small_storages == (50,)
    # a: 3x its bytes, so 3x its work; b saved nothing: the extent, linearly; c: half.
    assert [(layer.forward_seconds, layer.backward_seconds) for layer in scaled.layers] == [
        (3.0, 6.0),
        (2.0, 2.0),
        (0.5, 0.5),
    ]
    with pytest.raises(ValueError, match="must be profiled, not scaled"):
        scale_profile(profile, 1.0, measured=measured[:2])


def test_growth_is_learned_from_two_shapes_and_then_predicts_a_third():
    layers = (
        LayerProfile("embed", 64, 64),
        LayerProfile("attn", 64, 64),
        LayerProfile("pool", 64, 64),
        LayerProfile("empty", 0, 0),
    )
    profile = StepProfile(layers, static_bytes=0)
    exponents = [1.0, 2.0, 0.0, 1.0]
    second = _true_shape(profile, ShapeRatio(2.0, 2.0), exponents)
    learned = fit_growth(profile, second, ShapeRatio(2.0, 2.0))
    assert learned == (1.0, 2.0, 0.0, None)
    third = scale_profile(profile, ShapeRatio(1.0, 4.0), growth=learned)
    assert [layer.saved_bytes for layer in third.layers] == [256, 1024, 64, 0]
    assert fit_growth(profile, second, ShapeRatio(2.0, 1.0)) == (None,) * 4
    with pytest.raises(ValueError, match="same pass"):
        fit_growth(profile, StepProfile(layers[:2], 0), ShapeRatio(1.0, 2.0))


def test_shape_ratio_reads_batch_and_the_fastest_growing_input():
    assert shape_ratio([(8, 128), (8,)], [(4, 256), (4,)]) == ShapeRatio(0.5, 2.0)
    assert shape_ratio([(8, 3, 32, 32), (8, 10)], [(8, 3, 64, 32), (8, 10)]) == ShapeRatio(1.0, 2.0)
    assert shape_ratio([()], [()]) == ShapeRatio(1.0, 1.0)
    with pytest.raises(ValueError, match="same tensors and ranks"):
        shape_ratio([(8, 128)], [(8, 128, 1)])
    with pytest.raises(ValueError, match=r"ShapeRatio.batch"):
        ShapeRatio(0.0)


@settings(max_examples=150, deadline=None)
@given(profiles(min_layers=1, max_layers=7), st.floats(0.2, 1.0), st.data())
def test_a_plan_covers_every_shape_whose_layers_shrink(profile, fraction, data):
    """Shrinking layers (each by its own factor in (0, 1]) never raises the peak of a plan whose
    copy-out limit is 0 or none, so the plan made for the larger shape covers the smaller one,
    and its peak bounds the smaller's. Under a limit between, shrinking a later layer can leave
    an earlier one in the in-flight FIFO that the larger shape retired, and the storage brought
    back alone at the backward's start is then another, larger one: the peak may grow, so
    `plan_covers` computes, never assumes. (A layer that saves nothing at the smaller shape can
    too: the storage before it then meets the copy-out limit alone in the FIFO, and stays.)"""
    budget = int(profile.static_bytes + fraction * profile.saved_bytes)
    try:
        plan = plan_swaps(profile, budget)
    except BudgetTooSmallError:
        return
    factors = [data.draw(st.sampled_from([0.25, 0.5, 0.75, 1.0])) for _ in profile.layers]
    smaller = scale_profile(
        profile,
        1.0,
        growth=None,
        measured=[
            LayerProfile(
                layer.name,
                math.ceil(layer.saved_bytes * f),
                min(math.ceil(layer.saved_bytes * f), math.ceil(layer.swappable_bytes * f)),
            )
            for layer, f in zip(profile.layers, factors, strict=True)
        ],
    )
    choice = PlanChoice(plan.swap, plan.prefetch_window_bytes, plan.max_copying_out_bytes)
    peak = Simulator(smaller).peak_bytes(choice)
    assert plan_covers(plan, smaller) == (peak <= plan.predicted_peak_bytes)
    if plan.max_copying_out_bytes in (0, None):
        assert plan_covers(plan, smaller)
        assert peak <= budget
    # A shorter sequence with unknown growth keeps its bytes: covered at once.
    assert plan_covers(plan, scale_profile(profile, ShapeRatio(1.0, data.draw(st.floats(0.1, 1.0)))))


def test_a_plan_does_not_cover_a_larger_shape_or_another_pass():
    layers = tuple(LayerProfile(name, 100, 100, 1e-3, 2e-3) for name in "abcd")
    profile = StepProfile(layers, static_bytes=1_000)
    plan = plan_swaps(profile, budget_bytes=1_300)
    assert plan_covers(plan, profile)
    assert not plan_covers(plan, scale_profile(profile, ShapeRatio(1.0, 1.2), growth=[1.0] * 4))
    renamed = StepProfile(tuple(LayerProfile(f"x{i}", 10, 10) for i in range(4)), static_bytes=1_000)
    assert not plan_covers(plan, renamed)


def test_resaved_bytes_scale_with_their_layer():
    profile = StepProfile(
        (LayerProfile("relu", 100, 100, resaved_by=(("conv", 60),)), LayerProfile("conv", 0, 0)), 0
    )
    scaled = scale_profile(profile, ShapeRatio(2.0, 1.0))
    assert scaled.layers[0].resaved_by == (("conv", 120),)
    measured = scale_profile(
        profile, 2.0, measured=(LayerProfile("relu", 200, 200), LayerProfile("conv", 0, 0))
    )
    assert measured.layers[0].resaved_by == ()  # what the new step reported


def test_a_layer_that_vanishes_at_a_smaller_shape_is_not_covered_when_it_raises_the_peak():
    layers = tuple(LayerProfile(f"layer{i}", nbytes, nbytes) for i, nbytes in enumerate([3, 0, 0, 0, 1, 3]))
    profile = StepProfile(layers, static_bytes=0)
    plan = plan_swaps(profile, 5)
    smaller = scale_profile(
        profile, 1.0, measured=[LayerProfile(f"layer{i}", n, n) for i, n in enumerate([3, 0, 0, 0, 0, 2])]
    )
    assert plan.peak_bytes_on(smaller) > plan.predicted_peak_bytes
    assert not plan_covers(plan, smaller)


def test_a_smaller_later_layer_can_keep_an_earlier_one_in_flight_and_raise_the_peak():
    """Layers of 5, 1 and 6 bytes swapped under a copy-out limit of 6: the 6-byte layer retires
    both earlier ones in the larger shape; at 5 bytes it retires only the first, so the 1-byte
    layer stays in the FIFO while the first one's 2 bytes come back alone at the backward's start
    (13 bytes held against 12). The plan for the larger shape does not cover the smaller."""
    forward_seconds = (0.0, 0.0, 0.5, 0.0)
    layers = tuple(
        LayerProfile(f"layer{i}", n, n, forward_seconds[i], 0.0) for i, n in enumerate((5, 1, 6, 5))
    )
    profile = StepProfile(layers, 0, d2h_bytes_per_second=25.0, h2d_bytes_per_second=float("inf"))
    plan = plan_swaps(profile, 12)
    assert plan.swap == (True, True, True, False)
    assert (plan.prefetch_window_bytes, plan.max_copying_out_bytes, plan.predicted_peak_bytes) == (0, 6, 12)
    shrunk = [LayerProfile(layer.name, n, n) for layer, n in zip(layers, (2, 1, 5, 5), strict=True)]
    smaller = scale_profile(profile, 1.0, growth=None, measured=shrunk)
    assert plan.peak_bytes_on(smaller) == 13
    assert not plan_covers(plan, smaller)
