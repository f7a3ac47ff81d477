"""Every torchvision classification architecture and ten Hugging Face families train under
recomputation, at the least budget that keeping or recomputing fits, as plain training does.

Per model: plain training (its record), a run that names the least budget, then three steps
under ``policy="recompute"`` and under ``policy="auto"`` with a host link so slow that
recomputing is the cheaper choice. Each equals plain training (bitwise where plain training is
deterministic on this CPU) with every pass's ledger peak within the budget, and recomputes at
least one segment; what the profiling pass excluded carries its reason. The sweep is split
over files so that test workers share it.
"""

from __future__ import annotations

import pytest
import torchvision

from tests.recompute.sweep import sweep
from tests.recompute.zoo import TORCHVISION, torchvision_workload

pytestmark = pytest.mark.slow

NAMES = sorted(TORCHVISION)


def test_the_sweep_covers_every_torchvision_classification_model() -> None:
    assert set(TORCHVISION) == set(torchvision.models.list_models(module=torchvision.models))


@pytest.mark.parametrize("name", NAMES[: len(NAMES) // 2])
def test_torchvision_model_trains_under_recomputation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep(torchvision_workload(name), monkeypatch)
