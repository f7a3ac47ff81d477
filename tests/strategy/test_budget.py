"""Budgets: the accepted forms resolve to bytes; anything else names the accepted forms."""

import pytest
import torch

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.planner import Budget
from lightning_accudnn.session import OffloadConfig
from lightning_accudnn.session.device import device_memory, resolve_headroom

GB = 10**9


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("12GB", 12 * GB),
        ("12GiB", 12 * 2**30),
        ("12000MB", 12 * GB),
        ("1.5GB", 1_500_000_000),
        ("80%", 64 * GB),
        (" 12 gb ", 12 * GB),
        (12_000_000_000, 12 * GB),
    ],
)
def test_accepted_forms(spec, expected):
    assert Budget.parse(spec).resolve(total_bytes=80 * GB) == expected


def test_auto_is_the_free_memory_and_the_session_keeps_one_reserve_under_it():
    resolved = Budget.parse("auto").resolve(total_bytes=80 * GB, free_bytes=70 * GB)
    assert resolved == 70 * GB  # the budget: all that is free
    config = OffloadConfig(budget="auto")
    room, _ = resolve_headroom(config, torch.device("cpu"))
    _, free, _ = device_memory(torch.device("cpu"))
    assert room.reserve_bytes == 0  # no reserve on CPU
    assert abs(room.budget_bytes - free) < free // 10  # what was free a moment ago


def test_auto_on_a_gpu_keeps_one_reserve_of_five_percent_of_the_free_memory(monkeypatch):
    monkeypatch.setattr(
        "lightning_accudnn.session.device.device_memory", lambda device: (80 * GB, 80 * GB, "an 80 GB GPU")
    )
    room, _ = resolve_headroom(OffloadConfig(budget="auto"), torch.device("cuda", 0))
    assert room.budget_bytes == 80 * GB
    assert room.reserve_bytes == 4 * GB  # one reserve: the larger of 256 MiB and 5% of the budget
    assert room.usable_bytes == 76 * GB


def test_auto_with_less_free_than_the_reserve_is_refused(monkeypatch):
    monkeypatch.setattr(
        "lightning_accudnn.session.device.device_memory", lambda device: (80 * GB, 2**27, "a busy GPU")
    )
    with pytest.raises(ValueError, match="no more than the reserve"):
        resolve_headroom(OffloadConfig(budget="auto"), torch.device("cuda", 0))


@pytest.mark.parametrize(
    "spec", ["12 parsecs", "-1GB", "0", "0GB", "150%", "0%", "1.5", "12", "", "GB", 0, -5, 1.5, True]
)
def test_bad_budgets_raise_naming_the_accepted_forms(spec):
    with pytest.raises(ValueError, match="12GiB"):
        Budget.parse(spec)


def test_bad_budget_raises_when_the_strategy_is_built():
    with pytest.raises(ValueError, match="80%"):
        AccUDNNStrategy(budget="12 parsecs")


def test_budget_larger_than_the_device_names_its_size():
    with pytest.raises(ValueError, match="larger than"):
        Budget.parse("100GB").resolve(total_bytes=80 * GB, device_name="an 80 GB GPU")
