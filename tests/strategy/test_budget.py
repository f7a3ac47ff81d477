"""Budgets: the accepted forms resolve to bytes; anything else names the accepted forms."""

import pytest

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.planner import Budget

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


def test_auto_is_free_memory_less_a_reserve():
    resolved = Budget.parse("auto").resolve(total_bytes=80 * GB, free_bytes=70 * GB)
    assert resolved == 70 * GB - 4 * GB  # reserve: 5% of the device


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
