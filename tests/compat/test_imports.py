"""``import lightning_accudnn`` leaves Lightning alone, yet the strategy names work in either order.

Every program below runs in an interpreter of its own in which neither Lightning nor
lightning_accudnn was imported before: children forked by tests/compat/fresh_imports.py, one
interpreter for the whole file (it imports torch, torch._dynamo and torchvision once, before
forking, since every program imports them anyway)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("fresh_imports.py")

TRAINER = (
    "from lightning.pytorch import Trainer\n"
    "trainer = Trainer(strategy='accudnn', accelerator='cpu', devices=1, logger=False)\n"
    "assert type(trainer.strategy).__name__ == 'AccUDNNStrategy'\n"
    "print('ok')\n"
)
PRELUDES = {
    "accudnn-first": "import lightning_accudnn\n",
    "lightning-first": "import lightning.pytorch\nimport lightning_accudnn\n",
    "umbrella-package-after": "import lightning_accudnn\nimport lightning\n",
    # Lightning first imported by the lazy import of a strategy class (a circular import to avoid).
    "lazy-strategy-import-first": (
        "import lightning_accudnn\nfrom lightning_accudnn import AccUDNNDDPStrategy\n"
    ),
}
FIRST_USE = (
    "import sys\n"
    "import lightning_accudnn.cli\n"
    "from lightning_accudnn import OffloadConfig, OffloadSession, Budget\n"
    "loaded = [name for name in sys.modules if name == 'lightning' or name.startswith('lightning.')]\n"
    "print(sorted(loaded))\n"
    "import lightning_accudnn\n"
    "print(lightning_accudnn.EfficiencyTuner.__name__, 'AccUDNNStrategy' in dir(lightning_accudnn))\n"
)
#: What the command line must not import: Lightning, the engine, the session loop, the glue.
NOT_FOR_THE_CLI = (
    "lightning",
    "lightning_accudnn.callbacks",
    "lightning_accudnn.ops.engine",
    "lightning_accudnn.ops.pack",
    "lightning_accudnn.ops.transfers",
    "lightning_accudnn.session.session",
    "lightning_accudnn.strategy",
)
CLI_ONLY = (
    "import sys\n"
    "import lightning_accudnn.cli\n"
    f"refused = {NOT_FOR_THE_CLI!r}\n"
    "print(sorted(name for name in sys.modules if name.partition('.')[0] == 'lightning'\n"
    "             or any(name == r or name.startswith(r + '.') for r in refused)))\n"
    "from lightning_accudnn import OffloadSession, SwapSchedule, keep_on_device\n"
    "print(OffloadSession.__module__, SwapSchedule.__module__, keep_on_device.__module__)\n"
)
PROGRAMS = {
    **{name: prelude + TRAINER for name, prelude in PRELUDES.items()},
    "first-use": FIRST_USE,
    "cli-only": CLI_ONLY,
}


@pytest.fixture(scope="module")
def fresh_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every program of this file, each in its own fresh child: name -> status and output."""
    programs = tmp_path_factory.mktemp("programs") / "programs.json"
    programs.write_text(json.dumps(PROGRAMS))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(programs)],
        cwd=SCRIPT.parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _output(fresh_runs: dict[str, dict], name: str) -> str:
    run = fresh_runs[name]
    assert run["status"] == 0, run["output"][-3000:]
    return run["output"]


@pytest.mark.parametrize("ordering", list(PRELUDES))
def test_strategy_name_works_in_either_import_order(ordering, fresh_runs):
    assert _output(fresh_runs, ordering).strip().endswith("ok")


def test_the_command_line_and_the_session_do_not_import_lightning(fresh_runs):
    assert _output(fresh_runs, "first-use").strip().splitlines()[0] == "[]"


def test_lightning_names_load_on_first_use(fresh_runs):
    """The same program as the test above: Lightning is not loaded before the first use (its
    first line), then the first use of a Lightning name loads it."""
    lines = _output(fresh_runs, "first-use").strip().splitlines()
    assert lines[0] == "[]"  # not loaded before
    assert lines[1:] == ["EfficiencyTuner True"]


def test_the_command_line_imports_only_what_it_uses(fresh_runs):
    """``accudnn plan`` traces and plans: the engine, the session loop and Lightning stay unloaded
    until a name that needs them is used."""
    lines = _output(fresh_runs, "cli-only").strip().splitlines()
    assert lines[0] == "[]"
    assert lines[1:] == [
        "lightning_accudnn.session.session lightning_accudnn.ops.schedule lightning_accudnn.ops.pack"
    ]
