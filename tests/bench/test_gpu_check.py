"""The one-command GPU check: it refuses clearly without CUDA, and its steps name real commands."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_without_cuda_it_says_so_exits_nonzero_and_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--results-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == gpu_check.EXIT_NO_CUDA, completed.stdout + completed.stderr
    assert "no CUDA device is visible" in completed.stderr and "nothing was written" in completed.stderr
    assert list(tmp_path.iterdir()) == []


def test_list_names_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--list"]) == 0
    printed = capsys.readouterr().out
    for step in gpu_check.STEPS:
        assert f"{step.name}: " in printed
    assert "TORCH_CUDA_SANITIZER=1 python -m pytest -m cuda tests/gpu" in printed


def test_steps_run_existing_modules_and_tests() -> None:
    for step in gpu_check.STEPS:
        assert step.argv[0] == "-m"
        importlib.import_module(step.argv[1])
        if step.argv[1] == "pytest":
            assert (REPO_ROOT / "tests" / "gpu").is_dir()
        # The benchmarks write where the check writes (on the H100 the overhead step's JSON went
        # to the repository's bench/results while the bundle went to --results-dir).
        assert step.writes_results == (step.argv[1] != "pytest")
    with pytest.raises(SystemExit, match="unknown steps"):
        gpu_check.select_steps("cuda-tests,typo")


def test_a_step_is_logged_with_its_status(tmp_path: Path) -> None:
    results = tmp_path / "device"
    results.mkdir()
    script = f"open({str(results / 'made.json')!r}, 'w').write('{{}}'); print('hello from the step')"
    passed = gpu_check.run_step(
        gpu_check.Step("ok", ["-c", script], writes_results=False), tmp_path / "ok.log", results
    )
    assert passed["status"] == "passed" and passed["returncode"] == 0
    assert passed["result_files"] == ["made.json"]
    assert "hello from the step" in (tmp_path / "ok.log").read_text()
    failed = gpu_check.run_step(
        gpu_check.Step("bad", ["-c", "raise SystemExit(3)"], writes_results=False),
        tmp_path / "bad.log",
        results,
    )
    assert failed["status"] == "failed" and failed["returncode"] == 3 and failed["result_files"] == []


HEADLINE_ROWS = [
    "oracle",
    "accudnn-2x",
    "accudnn-static+1/2act",
    "accudnn-static+1/3act",
    "save_on_cpu",
    "torchtune",
    "checkpoint",
]


def test_the_headline_runs_first_each_command_under_8_minutes_all_under_20(
    capsys: pytest.CaptureFixture[str],
) -> None:
    headline = [step for step in gpu_check.STEPS if step.name.startswith("headline-")]
    assert [step.name for step in gpu_check.STEPS[: len(headline)]] == [step.name for step in headline]
    assert all(step.quick for step in headline)
    assert {step.argv[3] for step in headline} == {"resnet152", "gpt"}
    assert all(step.timeout_seconds < 8 * 60 for step in headline)
    assert sum(step.timeout_seconds for step in headline) < 20 * 60
    assert gpu_check.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for line, step in zip(lines, headline, strict=False):
        # with the allocator growing its segments in place, as the budgets' cap needs
        assert line.startswith(
            f"{step.name}: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python -m bench.run"
        )
        assert line.endswith(f"[time limit {step.timeout_seconds} s]")


def test_the_trace_checks_follow_the_calibration_and_their_cpu_form_runs(tmp_path: Path) -> None:
    from bench import trace_check

    names = [step.name for step in gpu_check.STEPS]
    checks = gpu_check.select_steps("trace-check-gpt2-medium-bf16,trace-check-resnet152-bf16")
    assert names.index(checks[0].name) == names.index("calibration-gpt2-medium-bf16") + 1
    assert names.index(checks[1].name) == names.index(checks[0].name) + 1
    assert [step.argv[3] for step in checks] == ["gpt2-medium-bf16", "resnet152-bf16"]
    assert all(step.timeout_seconds == 300 and step.writes_results for step in checks)
    commands = [gpu_check.quick_command(step, tmp_path) for step in checks]
    assert commands[0][4:] == commands[1][4:]  # one CPU form for both: run it once
    record = trace_check.main(commands[0][2:])
    assert record["case"] == "tiny" and record["device"] == "cpu" and record["measured_bytes"] > 0
    assert len(list((tmp_path / "cpu").glob("*-trace-check-tiny.*"))) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["headline-resnet152-bf16", "headline-gpt2-medium-bf16"])
def test_a_headline_command_runs_every_row_at_cpu_sizes(name: str, tmp_path: Path) -> None:
    from bench import run

    (step,) = gpu_check.select_steps(name)
    command = gpu_check.quick_command(step, tmp_path)
    assert command[:2] == ["-m", "bench.run"]
    result = run.main(command[2:])
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == HEADLINE_ROWS
    for row in rows.values():
        if row["name"] == "torchtune" and row["status"] == "not_installed":
            continue
        if row["name"] == "accudnn-2x" and row["status"] != "ok":  # at CPU sizes, below any plan
            assert row["status"] == "failed" and "too small" in row["error"], row["error"]
            continue
        assert row["status"] == "ok", (row["name"], row["error"])
        # On a CPU a peak is an RSS delta (it may be 0) or the engine's ledger (AccUDNN rows).
        assert row["median_step_seconds"] > 0 and row["peak_allocated_bytes"] >= 0
    static, peak = result["oracle_static_bytes"], result["oracle_peak_bytes"]
    assert 0 < static < peak
    assert rows["accudnn-2x"]["budget_bytes"] == int(peak / 2)
    for fraction, text in ((1 / 2, "1/2"), (1 / 3, "1/3")):
        row = rows[f"accudnn-static+{text}act"]
        assert row["budget_bytes"] == static + int((peak - static) * fraction)
        assert row["predicted_step_seconds"] > 0 and row["predicted_peak_bytes"] > 0
        assert 0 < row["peak_allocated_bytes"] <= row["budget_bytes"]
        assert row["graph_changed_steps"] == 0  # every replayed pass followed its sequence
    assert (tmp_path / "cpu").is_dir() and any(path.suffix == ".md" for path in (tmp_path / "cpu").iterdir())


def test_the_recompute_host_step_follows_the_headline_and_its_cpu_form_runs(tmp_path: Path) -> None:
    from bench.overhead import recompute

    names = [step.name for step in gpu_check.STEPS]
    assert names.index("recompute-host") == names.index("headline-gpt2-medium-bf16") + 1
    (step,) = gpu_check.select_steps("recompute-host")
    assert step.argv[:4] == ["-m", "bench.overhead.recompute", "--device", "cuda"]
    assert step.writes_results and step.timeout_seconds < 8 * 60
    command = gpu_check.quick_command(step, tmp_path)
    assert recompute.main(command[2:]) == 0
    (written,) = (tmp_path / "cpu").glob("*-recompute-host.json")
    data = json.loads(written.read_text())
    assert data["device"] == "cpu" and data["bitwise_equal"] and set(data["rows"]) == set(recompute.ROWS)
    assert all(row["cpu_ms_per_step"] > 0 for row in data["rows"].values())


def test_the_gpt_recompute_host_step_follows_it_and_its_cpu_form_runs(tmp_path: Path) -> None:
    from bench.overhead import recompute

    names = [step.name for step in gpu_check.STEPS]
    assert names.index("recompute-host-gpt2-medium") == names.index("recompute-host") + 1
    (step,) = gpu_check.select_steps("recompute-host-gpt2-medium")
    assert step.writes_results and step.timeout_seconds < 8 * 60
    assert recompute.main(gpu_check.quick_command(step, tmp_path)[2:]) == 0
    (written,) = (tmp_path / "cpu").glob("*-recompute-host-gpt2-medium.json")
    data = json.loads(written.read_text())
    assert data["model"]["workload"] == "tiny gpt2-medium" and data["model"]["layers"] == 2
    assert "GPT-2 medium" in data["label"] and data["bitwise_equal"]
    assert set(data["rows"]) == set(recompute.ROWS)
