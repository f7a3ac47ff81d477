"""The Hugging Face part of the recompute sweep (see ``test_sweep_torchvision_a``)."""

from __future__ import annotations

import pytest

from tests.recompute.sweep import sweep
from tests.recompute.zoo import HUGGING_FACE, hugging_face_workload

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(HUGGING_FACE))
def test_hugging_face_model_trains_under_recomputation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    sweep(hugging_face_workload(name), monkeypatch)
