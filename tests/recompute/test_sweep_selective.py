"""Selective recomputation over part of the sweep's zoo: convolutional networks (BatchNorm,
in-place activations, squeeze-and-excitation, stochastic depth), a vision transformer and three
Hugging Face families, each trained 3 steps under ``policy="selective"`` at the least budget
that policy names: bit for bit plain training, every pass within the budget, the plan's
predicted peak never below the engine's ledger (see :func:`tests.recompute.sweep.sweep_selective`)."""

from __future__ import annotations

import pytest

from tests.recompute.sweep import sweep_selective
from tests.recompute.zoo import hugging_face_workload, torchvision_workload

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v3_small", "vit_b_16", "efficientnet_b0"])
def test_torchvision_model_trains_under_selective_recomputation(name: str) -> None:
    sweep_selective(torchvision_workload(name))


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_hugging_face_model_trains_under_selective_recomputation(name: str) -> None:
    pytest.importorskip("transformers")
    sweep_selective(hugging_face_workload(name))


def test_a_kept_output_written_in_place_is_not_recomputed_selectively() -> None:
    """MobileNetV3's classifier runs an in-place Hardswish on its first linear layer's output:
    replaying it selectively would read the written values, so that segment is not a selective
    candidate (and the sweep above trains the model bit for bit without it)."""
    outcome = sweep_selective(torchvision_workload("mobilenet_v3_small"))
    classifier = {segment.name: segment for segment in outcome.plan.profile.segments}["classifier"]
    assert classifier.selective_kept_bytes is None
    assert "classifier" not in outcome.plan.selective
    reasons = {entry.name: entry.reason for entry in outcome.plan.profile.excluded_segments}
    assert reasons["classifier"].startswith("not recomputed selectively: aten.hardswish_")
    assert "writes in place into an output that recomputing it selectively keeps" in reasons["classifier"]
