"""The tuner's predictions and profile scaling take recomputation into account."""

from __future__ import annotations

from lightning_accudnn.callbacks.prediction import predict_batch_sizes
from lightning_accudnn.planner.scaling import ShapeRatio, scale_profile
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile


def _profile() -> StepProfile:
    layers = tuple(LayerProfile(f"b{i}.{part}", 50, 0, 1e-3, 2e-3) for i in range(4) for part in "xy")
    segments = tuple(SegmentProfile(f"b{i}", 10, 10) for i in range(4))
    return StepProfile(layers, static_bytes=100, segments=segments)


def test_scaling_grows_the_segments_with_the_batch():
    scaled = scale_profile(_profile(), ShapeRatio(batch=2.0))
    assert [segment.input_bytes for segment in scaled.segments] == [20] * 4
    assert [segment.output_bytes for segment in scaled.segments] == [20] * 4


def test_recomputation_lets_a_larger_batch_fit_where_nothing_can_swap():
    profile = _profile()  # 400 bytes of activations, none swappable
    budget = 100 + 400  # exactly the measured batch with everything kept
    swap = predict_batch_sizes(profile, 8, None, [8, 16], budget, policy="swap")
    auto = predict_batch_sizes(profile, 8, None, [8, 16], budget, policy="auto")
    assert swap[8].feasible and not swap[16].feasible
    assert auto[16].feasible
