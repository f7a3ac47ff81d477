"""``python -m bench.planner.speed`` with its processes faked: the rounds it runs, the record and
the table it writes, and the import floor's own process (a real one, on a torch-only model).

No timing is asserted: the fake processes return set figures, and the test checks that each
lands in its field and column.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.environment import REPO_ROOT
from bench.planner import speed
from bench.planner.import_floor import library_imports
from bench.planner.phases import PHASES

#: Seconds the fake processes take, by kind, in round ``r`` (wall, CPU): distinct everywhere.
FIGURES = {"cli": (5.0, 5.5), "baseline": (7.0, 7.5), "floor": (2.0, 2.25), "phases": (9.0, 9.0)}


class FakeProcesses:
    """Stands for :func:`bench.planner.speed._timed`: records each command and returns its kind's
    figures, plus the round number (0, 1, ...)."""

    def __init__(self, baseline: Path | None) -> None:
        self.baseline = baseline
        self.calls: list[tuple[str, Path]] = []

    def kind(self, command: list[str], cwd: Path) -> str:
        if command[1:3] == ["-m", "lightning_accudnn"]:
            return "baseline" if cwd == self.baseline else "cli"
        return {"bench.planner.import_floor": "floor", "bench.planner.phases": "phases"}[command[2]]

    def __call__(self, command: list[str], cwd: Path) -> tuple[float, float, str]:
        kind = self.kind(command, cwd)
        round_ = sum(1 for other, _ in self.calls if other == kind)
        self.calls.append((kind, cwd))
        wall, cpu = FIGURES[kind]
        laps = {clock: {name: 0.5 for name in PHASES} for clock in ("wall", "cpu")}
        return wall + round_, cpu + round_, json.dumps(laps) + "\n"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeProcesses:
    processes = FakeProcesses(baseline=tmp_path / "baseline")
    monkeypatch.setattr(speed, "_timed", processes)
    monkeypatch.setattr(speed, "_half_budget", lambda case, gpu: 12_345)
    return processes


def test_the_floor_runs_in_every_round_after_the_cli(fake: FakeProcesses, tmp_path: Path) -> None:
    record = speed.measure_case("gpt2-medium-bf16", "h100", 3, tmp_path / "repo", fake.baseline)
    kinds = [kind for kind, _ in fake.calls]
    assert kinds == ["baseline", "cli", "floor", "phases"] * 3
    assert {cwd for kind, cwd in fake.calls if kind == "floor"} == {REPO_ROOT}
    assert record["import_floor_command"] == ["-m", "bench.planner.import_floor", "models:gpt2_medium"]
    assert record["import_floor_wall_seconds"] == {"median": 3.0, "min": 2.0, "max": 4.0, "n": 3}
    assert record["import_floor_cpu_seconds"] == {"median": 3.25, "min": 2.25, "max": 4.25, "n": 3}
    assert record["cli_wall_seconds"]["median"] == 6.0
    assert record["baseline_cli_cpu_seconds"]["median"] == 8.5


@pytest.mark.parametrize("with_baseline", [False, True])
def test_record_and_table_carry_the_floor(fake: FakeProcesses, tmp_path: Path, with_baseline: bool) -> None:
    results = tmp_path / "results"
    argv = ["--cases", "resnet152-bf16", "--runs", "2", "--results-dir", str(results), "--name", "t"]
    argv += ["--repo", str(REPO_ROOT), "--commit", "abc"]
    if with_baseline:
        argv += ["--baseline", str(fake.baseline), "--baseline-commit", "def"]
    speed.main(argv)
    (written,) = (results / "cpu").glob("*-t.json")
    (case,) = json.loads(written.read_text())["cases"]
    assert case["import_floor_wall_seconds"] == {"median": 2.5, "min": 2.0, "max": 3.0, "n": 2}
    assert case["import_floor_cpu_seconds"] == {"median": 2.75, "min": 2.25, "max": 3.25, "n": 2}
    assert case["import_floor_command"][-1] == "torchvision:resnet152"
    text = written.with_suffix(".md").read_text()
    assert "import floor" in text.split("\n")[2]  # the label says what the floor is
    header, rule, row = (line for line in text.splitlines() if line.startswith("|"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(names) == len(cells) == rule.count("---")
    by_name = dict(zip(names, cells, strict=True))
    assert by_name["import floor wall s"] == "2.50 [2.00, 3.00]"
    assert by_name["import floor CPU s"] == "2.75 [2.25, 3.25]"
    assert by_name["CLI wall s"] == "5.50 [5.00, 6.00]"
    assert ("baseline CLI wall s" in by_name) == with_baseline


def test_library_imports_follow_the_model_spec() -> None:
    assert library_imports("torchvision:resnet152") == ["import torchvision.models"]
    assert library_imports("bench.planner.models:gpt2_medium") == [
        "import bench.planner.models",
        "from transformers import GPT2Config, GPT2LMHeadModel",
    ]
    assert library_imports("bench.planner.models:llama_1b") == [
        "import bench.planner.models",
        "from transformers import LlamaConfig, LlamaForCausalLM",
    ]
    assert library_imports("bench.planner.models:tiny_transformer") == ["import bench.planner.models"]


def test_the_floor_process_imports_torch_and_the_model_but_not_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.planner.import_floor", "bench.planner.models:tiny_transformer"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"torch", "bench"} <= set(imported["packages"])
    assert not {"lightning_accudnn", "lightning", "transformers", "torchvision"} & set(imported["packages"])
    assert imported["dynamo"] is False
