"""``import lightning_accudnn`` leaves Lightning alone, yet the strategy names work in either order."""

import subprocess
import sys

import pytest

# Each test starts a fresh interpreter (torch and Lightning imported from scratch).
pytestmark = pytest.mark.slow


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


TRAINER = (
    "from lightning.pytorch import Trainer\n"
    "trainer = Trainer(strategy='accudnn', accelerator='cpu', devices=1, logger=False)\n"
    "assert type(trainer.strategy).__name__ == 'AccUDNNStrategy'\n"
    "print('ok')\n"
)


@pytest.mark.parametrize(
    "prelude",
    [
        "import lightning_accudnn\n",
        "import lightning.pytorch\nimport lightning_accudnn\n",
        "import lightning_accudnn\nimport lightning\n",
        # Lightning first imported by the lazy import of a strategy class (a circular import to avoid).
        "import lightning_accudnn\nfrom lightning_accudnn import AccUDNNDDPStrategy\n",
    ],
    ids=["accudnn-first", "lightning-first", "umbrella-package-after", "lazy-strategy-import-first"],
)
def test_strategy_name_works_in_either_import_order(prelude):
    assert _run(prelude + TRAINER).strip().endswith("ok")


@pytest.fixture(scope="module")
def first_use() -> list[str]:
    """One fresh interpreter for the two tests below: what the command line and the session load,
    then the first use of a Lightning name (Lightning not loaded until then, as that line shows)."""
    code = (
        "import sys\n"
        "import lightning_accudnn.cli\n"
        "from lightning_accudnn import OffloadConfig, OffloadSession, Budget\n"
        "loaded = [name for name in sys.modules if name == 'lightning' or name.startswith('lightning.')]\n"
        "print(sorted(loaded))\n"
        "import lightning_accudnn\n"
        "print(lightning_accudnn.EfficiencyTuner.__name__, 'AccUDNNStrategy' in dir(lightning_accudnn))\n"
    )
    return _run(code).strip().splitlines()


def test_the_command_line_and_the_session_do_not_import_lightning(first_use):
    assert first_use[0] == "[]"


def test_lightning_names_load_on_first_use(first_use):
    assert first_use[0] == "[]"  # not loaded before
    assert first_use[1:] == ["EfficiencyTuner True"]
