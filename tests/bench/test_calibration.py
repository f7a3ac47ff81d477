"""bench.calibration end to end on the CPU: the three runs, their figures and the files."""

import json

import pytest
import torch

from bench import calibration, replan
from bench.streams import DeviceActivity, stream_breakdown
from bench.workloads import make_workload


def test_calibration_writes_the_three_runs(tmp_path):
    record = calibration.main(
        [
            "--workload",
            "tiny",
            "--device",
            "cpu",
            "--warmup",
            "2",
            "--steps",
            "1",
            "--results-dir",
            str(tmp_path),
        ]
    )
    assert record["plain"]["median_step_seconds"] > 0
    kept, part = record["kept"], record["fraction"]
    # Where the time went on the device: CUDA only (one step under torch.profiler).
    assert "streams" not in record["plain"] and kept["streams"] is None and part["streams"] is None
    assert kept["swapped_bytes"] == 0 and kept["recomputed_segments"] == 0
    assert part["budget_bytes"] == kept["static_bytes"] + kept["saved_bytes"] // 2
    assert part["swapped_bytes"] > 0 or part["recomputed_segments"] > 0
    assert kept["profiled_forward_seconds"] > 0 and kept["profiled_backward_seconds"] > 0
    assert len(part["steps"]) == 3 and part["steps"][0]["source"] == "profiling"
    assert [layer["name"] for layer in part["profile"]["layers"]] == [
        layer["name"] for layer in part["plan"]["layers"]
    ]
    assert part["profile"]["static_bytes"] == part["static_bytes"]
    (written,) = (tmp_path / "cpu").glob("*-calibration-tiny.json")
    assert json.loads(written.read_text())["kind"] == "calibration"
    markdown = written.with_suffix(".md").read_text()
    assert "static + 1/2 act" in markdown and "Where the time went" not in markdown
    # A session run given a breakdown (as on CUDA) gets its line.
    copy = DeviceActivity("Memcpy DtoH (Device -> Pinned)", 13, 0.0, 0.002)
    breakdown = stream_breakdown([DeviceActivity("conv", 7, 0.0, 0.003), copy], wall_seconds=0.004)
    text = calibration.markdown({**record, "fraction": {**part, "streams": breakdown.as_dict()}})
    assert "\n- fraction: step 4.0 ms under the profiler; compute stream 7: kernels 3.0 ms" in text


def test_a_session_the_budget_refuses_is_recorded_with_its_error():
    run = calibration.session_run(make_workload("tiny"), torch.device("cpu"), 1_000, warmup=1, steps=0)
    assert run["steps"] == [] and run["error"].startswith("BudgetTooSmallError")


def test_a_recorded_profile_plans_again_as_the_session_planned_it(tmp_path):
    sizes = ["--warmup", "2", "--steps", "1", "--results-dir", str(tmp_path)]
    calibration.main(["--workload", "tiny", "--device", "cpu", *sizes])
    (written,) = (tmp_path / "cpu").glob("*-calibration-tiny.json")
    run = json.loads(written.read_text())["fraction"]
    plan = replan.replan(run)
    recorded = run["plan"]
    assert [choice.value for choice in plan.choices] == [layer["choice"] for layer in recorded["layers"]]
    assert plan.predicted_step_seconds == recorded["predicted_step_seconds"]
    assert plan.predicted_peak_bytes == recorded["predicted_peak_bytes"]
    printed = replan.main([str(written), "--run", "kept", "--budget", "1GB", "--policy", "swap"])
    assert printed.budget_bytes == 10**9 and not printed.swapped_layers


def test_a_recomputing_session_records_its_measured_cost_and_plans_again_without_it(tmp_path):
    sizes = ["--warmup", "4", "--steps", "1", "--results-dir", str(tmp_path)]
    arguments = ["--workload", "tiny", "--device", "cpu", "--policy", "recompute", "--fraction", "3/4"]
    calibration.main([*arguments, *sizes])
    (written,) = (tmp_path / "cpu").glob("*-calibration-tiny-recompute.json")
    record = json.loads(written.read_text())
    run = record["fraction"]
    assert record["policy"] == "recompute"
    assert run["recomputed_segments"] > 0 and run["swapped_bytes"] == 0
    planned, measured = run["recompute_cost_ratio"], run["measured_recompute_cost_ratio"]
    assert measured is not None and measured != 1.0  # timed in the passes replayed under the plan
    assert run["profile"]["recompute_cost_ratio"] == planned
    assert f"{planned:.2f}x" in written.with_suffix(".md").read_text()
    again = replan.replan(run)
    assert again.recompute_seconds == run["recompute_seconds"]
    at_forward = replan.main([str(written), "--recompute-cost-ratio", "1"])
    at_measured = replan.main([str(written), "--recompute-cost-ratio", str(measured)])
    assert at_forward.profile.recompute_cost_ratio == 1.0
    assert at_measured.profile.recompute_cost_ratio == pytest.approx(measured)
