"""The benchmark harness end to end on the CPU: every strategy row, the files, failures as rows.

No speed is asserted: the CPU mode checks that the harness runs and records what it
measured (and what failed), not how fast anything is.
"""

from __future__ import annotations

import doctest
import importlib
import json
import math
import subprocess
from pathlib import Path

import pytest

from bench import deepest
from bench import run as bench_run
from bench.deepest import search_depth
from bench.row import ROW_FIELDS
from bench.streams import DeviceActivity, stream_breakdown
from bench.workloads import blocks_for_depth, stage_blocks

REPO_ROOT = Path(__file__).resolve().parents[2]

EXPECTED_ROWS = {
    "oracle": "oracle",
    "accudnn-2x": "accudnn",
    "accudnn-2x-swap": "accudnn",
    "accudnn-3x": "accudnn",
    "accudnn-3x-swap": "accudnn",
    "accudnn-4x": "accudnn",
    "accudnn-4x-swap": "accudnn",
    "accudnn-1KB": "accudnn",
    "accudnn-1KB-swap": "accudnn",
    "save_on_cpu": "save_on_cpu",
    "torchtune": "torchtune",
    "checkpoint": "checkpoint",
    "compile-amb0.5": "compile",
}
STATUSES = {"ok", "oom", "failed", "not_installed", "skipped"}
MEASURED = ("peak_allocated_bytes", "median_step_seconds", "median_fwd_bwd_seconds", "samples_per_second")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One CPU run of the whole harness, through ``bench.run.main`` (the entry point of
    ``python -m bench.run``) in this process: a fresh interpreter would add seconds of imports."""
    results = tmp_path_factory.mktemp("results")
    argv = [
        "--workload",
        "tiny",
        "--device",
        "cpu",
        "--budgets",
        "1KB",  # far below the model state: must come back as a failed row, not a crash
        "--steps",
        "2",
        "--results-dir",
        str(results),
    ]
    bench_run.main(argv)
    written = sorted((results / "cpu").glob("*-tiny.json"))
    assert len(written) == 1, list((results / "cpu").iterdir())
    return json.loads(written[0].read_text()), written[0].parent


def test_every_strategy_is_a_row_with_every_field(cpu_run: tuple[dict, Path]) -> None:
    data, _ = cpu_run
    rows = {row["name"]: row for row in data["rows"]}
    assert list(rows) == list(EXPECTED_ROWS)
    for name, row in rows.items():
        assert row["strategy"] == EXPECTED_ROWS[name]
        assert set(ROW_FIELDS) <= set(row), f"{name} lacks {set(ROW_FIELDS) - set(row)}"
        assert row["status"] in STATUSES
        assert row["streams"] is None, name  # the profiled step's breakdown runs on CUDA only
        assert row["allocator_calls_per_step"] is None, name  # CUDA's allocator's counters
        if row["status"] == "ok":
            for key in MEASURED:
                assert isinstance(row[key], (int, float)) and row[key] >= 0, (name, key, row[key])
            assert row["measured_steps"] == 2 and len(row["step_seconds"]) == row["warmup_steps"] + 2
            # issued before the device is synchronised: never after the forward and backward end
            assert 0 < row["median_fwd_bwd_issue_seconds"] <= row["median_fwd_bwd_seconds"], name
            assert row["peak_source"] in ("engine_ledger", "process_rss_delta")
            assert row["bytes_swapped_out"] is not None
            assert math.isfinite(row["loss_first"])
        else:
            assert row["error"], f"{name}: a row that did not run says why"


def test_oracle_and_accudnn_report_bounds_and_predictions(cpu_run: tuple[dict, Path]) -> None:
    data, _ = cpu_run
    rows = {row["name"]: row for row in data["rows"]}
    oracle = rows["oracle"]
    assert oracle["status"] == "ok"
    assert data["oracle_peak_bytes"] == oracle["ledger_peak_bytes"] > 0
    half = rows["accudnn-2x"]
    assert half["status"] == "ok", half["error"]
    assert half["budget_bytes"] == int(data["oracle_peak_bytes"] / 2)
    assert half["peak_source"] == "engine_ledger"
    assert half["bytes_swapped_out"] > 0
    for key in ("lower_bound_seconds", "bound_ratio", "predicted_peak_bytes", "predicted_step_seconds"):
        assert half[key] is not None and half[key] > 0, key
    assert half["peak_reduction"] is not None and half["plan"]["swapped_layers"] > 0
    # The session's forward and backward make its step; the plan predicted its forward.
    assert half["engine_forward_seconds"] > 0 and half["engine_backward_seconds"] > 0
    assert half["engine_forward_seconds"] + half["engine_backward_seconds"] == pytest.approx(
        half["engine_step_seconds"], rel=0.5
    )
    assert 0 < half["plan"]["predicted_forward_seconds"] < half["predicted_step_seconds"]
    # The engine's host time for its swaps, measured by the session: part of the host's issue time.
    assert 0 < half["engine_host_seconds"] <= half["median_fwd_bwd_issue_seconds"]
    assert data["lower_bound_profile"] == "accudnn-2x"
    assert oracle["lower_bound_seconds"] is not None and oracle["bound_ratio"] is not None
    # The same batches and seed for every strategy: the first loss is the same wherever it ran.
    first_losses = {row["loss_first"] for row in data["rows"] if row["status"] == "ok"}
    assert max(first_losses) - min(first_losses) < 1e-4


def test_failures_are_rows(cpu_run: tuple[dict, Path]) -> None:
    data, _ = cpu_run
    rows = {row["name"]: row for row in data["rows"]}
    impossible = rows["accudnn-1KB"]
    assert impossible["status"] == "failed"
    assert impossible["error_type"] == "BudgetTooSmallError"
    assert impossible["budget_bytes"] == 1000
    assert impossible["median_step_seconds"] is None  # nothing measured, nothing written
    try:
        importlib.import_module("torchtune.training")
    except ImportError:
        assert rows["torchtune"]["status"] == "not_installed"


def test_files_environment_and_label(cpu_run: tuple[dict, Path]) -> None:
    data, folder = cpu_run
    files = data["files"]
    markdown = (folder / files["markdown"]).read_text()
    for name in EXPECTED_ROWS:
        assert f"| {name} |" in markdown
    assert "CPU smoke run" in markdown and "CPU smoke run" in data["label"]
    assert "Where the time went" not in markdown
    assert (folder / files["log"]).read_text().strip()
    plot = data["plot"]
    if plot["written"]:
        assert files["png"] and (folder / files["png"]).stat().st_size > 0
    else:
        assert "matplotlib" in plot["reason"] and files["png"] is None
        assert not list(folder.glob("*.png"))
    env = data["environment"]
    assert env["device"] == "cpu" and env["device_slug"] == "cpu" and env["driver"] is None
    assert env["torch"] and "cuda" in env and env["git"]["commit"]


def test_a_row_with_a_stream_breakdown_says_where_its_time_went(cpu_run: tuple[dict, Path]) -> None:
    """The CPU run has no breakdown; a row given one (as a CUDA run fills it) gets its line."""
    data, _ = cpu_run
    activities = [DeviceActivity("conv", 7, 0.0, 0.004), DeviceActivity("conv", 7, 0.005, 0.006)]
    rows = [{**row, "streams": None} for row in data["rows"]]
    rows[1]["streams"] = stream_breakdown(activities, wall_seconds=0.0065).as_dict()
    markdown = bench_run._markdown({**data, "rows": rows})
    section = markdown.split("Where the time went", 1)[1].split("\n\n")[1]
    (line,) = section.splitlines()  # the other rows have no breakdown
    assert line.startswith("- accudnn-2x: step 6.5 ms under the profiler; compute stream 7: kernels 5.0 ms")


def test_every_row_that_ran_says_where_its_hosts_time_went(cpu_run: tuple[dict, Path]) -> None:
    data, folder = cpu_run
    ran = [row for row in data["rows"] if row["status"] == "ok"]
    for row in ran:
        host = row["host_profile"]
        assert host["steps"] == 2 and host["calls_per_step"] > 0, row["name"]
        own = [function["own_ms_per_step"] for function in host["functions"]]
        assert own == sorted(own, reverse=True) and len(own) == 25, row["name"]
    section = (folder / data["files"]["markdown"]).read_text().split("Where the host's time went", 1)[1]
    lines = [line for line in section.split("\n\n")[1].splitlines() if line.startswith("- ")]
    assert [line.split(":")[0] for line in lines] == [f"- {row['name']}" for row in ran]


def test_deepest_search_on_cpu(tmp_path: Path) -> None:
    data = deepest.main(
        [
            "--device",
            "cpu",
            "--budget",
            "3MB",
            "--batch-size",
            "2",
            "--image-size",
            "32",
            "--base-width",
            "4",
            "--start-depth",
            "14",
            "--max-depth",
            "110",
            "--resolution",
            "4",
            "--results-dir",
            str(tmp_path),
        ]
    )
    accudnn = data["results"]["accudnn"]
    assert accudnn["status"] == "ok" and accudnn["deepest_depth"] >= 14
    assert data["results"]["none"]["status"] == "skipped"  # no allocator cap on a CPU
    probes = accudnn["probes"]
    assert [probe["depth"] for probe in probes][:2] == [14, 26]
    assert all(isinstance(probe["trains"], bool) for probe in probes)
    trained = [probe["depth"] for probe in probes if probe["trains"]]
    assert max(trained) == accudnn["deepest_depth"]
    failed = [probe for probe in probes if not probe["trains"]]
    if failed:
        assert min(probe["depth"] for probe in failed) == accudnn["first_failing_depth"]
        assert all(probe["error"] or probe["notes"] for probe in failed)
    assert (tmp_path / "cpu" / data["files"]["json"]).exists()
    assert (tmp_path / "cpu" / data["files"]["markdown"]).exists()


def test_search_depth_brackets_the_deepest() -> None:
    for limit in (4, 5, 37, 64, 999):
        outcome = search_depth(lambda blocks, limit=limit: blocks <= limit, 4, 1000)
        assert outcome.deepest_blocks == limit and outcome.first_failing_blocks == limit + 1
    assert search_depth(lambda blocks: False, 50, 1000).deepest_blocks is None
    assert search_depth(lambda blocks: True, 4, 100).reached_max


def test_depth_arithmetic() -> None:
    assert blocks_for_depth(152) == 50 and stage_blocks(50) == (3, 8, 36, 3)
    for blocks in range(4, 400, 7):
        stages = stage_blocks(blocks)
        assert sum(stages) == blocks and min(stages) >= 1
    with pytest.raises(ValueError):
        blocks_for_depth(100)


BENCH_MODULES = [
    "workloads",
    "measure",
    "environment",
    "report",
    "config",
    "row",
    "runner",
    "techniques",
    "techniques.base",
    "techniques.accudnn",
    "techniques.capped",
    "techniques.save_on_cpu",
    "techniques.torchtune_offload",
    "techniques.checkpoint",
    "techniques.compiled",
    "deepest",
    "run",
    "gpu_check",
    "overhead.models",
    "overhead.spread",
    "overhead.fits",
    "overhead.floor",
    "overhead.budgets",
    "overhead.projection",
    "overhead.figures",
    "overhead.cuda_calls",
    "calibration",
    "streams",
    "host_profile",
    "replan",
    "trace_check",
    "planner.monotone",
    "planner.checkouts",
    "planner.budget_sweep",
    "planner.plan_time",
    "planner.timed_plans",
]


@pytest.mark.parametrize("module", BENCH_MODULES)
def test_docstring_examples(module: str) -> None:
    imported = importlib.import_module(f"bench.{module}")
    result = doctest.testmod(imported, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_git_state_names_tracked_paths() -> None:
    from bench.environment import git_state

    state = git_state()
    tracked = set(
        subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.split()
    )
    assert state["commit"] and len(state["commit"]) == 40
    assert all(path in tracked for path in state["dirty_paths"] if " -> " not in path), state["dirty_paths"]
