"""The tuner's predictions and profile scaling take recomputation into account."""

from __future__ import annotations

from lightning_accudnn.callbacks.prediction import predict_batch_sizes
from lightning_accudnn.planner.scaling import ShapeRatio, scale_profile
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile


def _profile(swappable: int = 0, link: float = float("inf")) -> StepProfile:
    layers = tuple(LayerProfile(f"b{i}.{part}", 50, swappable, 1e-3, 2e-3) for i in range(4) for part in "xy")
    segments = tuple(SegmentProfile(f"b{i}", 10, 10) for i in range(4))
    return StepProfile(
        layers, static_bytes=100, segments=segments, d2h_bytes_per_second=link, h2d_bytes_per_second=link
    )


def test_scaling_grows_the_segments_with_the_batch():
    scaled = scale_profile(_profile(), ShapeRatio(batch=2.0))
    assert [segment.input_bytes for segment in scaled.segments] == [20] * 4
    assert [segment.output_bytes for segment in scaled.segments] == [20] * 4


def test_with_a_slow_link_the_tuner_predicts_the_recomputing_plan_faster():
    profile = _profile(swappable=50, link=1e3)  # 400 bytes of activations, every one swappable
    budget = 500  # batch 16 needs 900 unconstrained: 420 recomputing, 300 swapping everything
    swap = predict_batch_sizes(profile, 8, None, [8, 16], budget, policy="swap")
    auto = predict_batch_sizes(profile, 8, None, [8, 16], budget, policy="auto")
    assert swap[16].feasible and auto[16].feasible
    assert auto[16].seconds_per_batch < swap[16].seconds_per_batch / 10


def test_no_batch_is_predicted_to_fit_below_its_profiling_pass():
    """Nothing swappable: recomputing would fit batch 16 in 420 bytes, but its profiling pass
    (every activation swapped, nothing recomputed) keeps all 900, so no policy predicts it fits
    and each names that figure."""
    profile = _profile()
    budget = 100 + 400  # exactly the measured batch with everything kept
    for policy in ("swap", "auto", "recompute"):
        predictions = predict_batch_sizes(profile, 8, None, [8, 16], budget, policy=policy)
        assert predictions[8].feasible and not predictions[16].feasible
        assert predictions[16].peak_bytes == 100 + 800


def test_the_largest_fitting_batch_the_tuner_adds_is_predicted_under_the_same_policy():
    """A free link: auto would swap the largest fitting batch for nothing, recompute pays."""
    profile = _profile(swappable=50)
    added = predict_batch_sizes(profile, 8, None, [8, 64], 700, add_largest=True, policy="recompute")
    (largest,) = set(added) - {8, 64}
    alone = predict_batch_sizes(profile, 8, None, [largest], 700, policy="recompute")[largest]
    auto = predict_batch_sizes(profile, 8, None, [largest], 700, policy="auto")[largest]
    assert added[largest].seconds_per_batch == alone.seconds_per_batch > auto.seconds_per_batch
