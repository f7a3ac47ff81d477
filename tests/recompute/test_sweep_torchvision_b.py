"""The second half of the torchvision sweep (see ``test_sweep_torchvision_a``)."""

from __future__ import annotations

import pytest

from tests.recompute.sweep import sweep
from tests.recompute.zoo import TORCHVISION, torchvision_workload

pytestmark = pytest.mark.slow

NAMES = sorted(TORCHVISION)


@pytest.mark.parametrize("name", NAMES[len(NAMES) // 2 :])
def test_torchvision_model_trains_under_recomputation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep(torchvision_workload(name), monkeypatch)
