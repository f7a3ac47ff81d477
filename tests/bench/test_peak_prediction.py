"""bench.peak_prediction end to end on the CPU: every planned step's peak against its plan's."""

import dataclasses
import json

import pytest
import torch

from bench import peak_prediction

# A two-layer GPT, a batch of 4 sequences of 64 tokens, float32, on the CPU.
SMALL_GPT = [
    "--workload",
    "gpt",
    "--param",
    "layers=2",
    "--param",
    "d_model=64",
    "--param",
    "heads=4",
    "--param",
    "seq_len=64",
    "--param",
    "vocab=2000",
    "--param",
    "batch_size=4",
    "--precision",
    "fp32",
    "--device",
    "cpu",
]


def test_peak_prediction_sets_each_planned_step_against_its_plan(tmp_path):
    record = peak_prediction.main(
        [
            *SMALL_GPT,
            "--fractions",
            "0.9",
            "--policies",
            "auto",
            "--steps",
            "4",
            "--results-dir",
            str(tmp_path),
        ]
    )
    assert record["allocator"].startswith("OpBytesAllocator")
    (run,) = record["runs"]
    assert run["budget"] == int(0.9 * record["kept_peak_bytes"])
    assert run["steps"], run.get("refused")
    for step in run["steps"]:
        assert step["peak_bytes"] <= step["predicted_peak_bytes"]  # never a prediction below
        assert step["peak_bytes"] <= run["budget"]
    (written,) = (tmp_path / "cpu").glob("*-peak-prediction-gpt.json")
    assert json.loads(written.read_text())["runs"][0]["policy"] == "auto"
    assert "| 0.9 | auto |" in written.with_suffix(".md").read_text()


def test_rows_that_vary_plan_later_shapes_from_scaled_profiles_within_their_predictions(tmp_path):
    record = peak_prediction.main(
        [
            *SMALL_GPT,
            "--fractions",
            "0.9",
            "--policies",
            "swap",
            "--rows",
            "2,4,3",
            "--steps",
            "5",
            "--results-dir",
            str(tmp_path),
        ]
    )
    assert record["kept_peak_bytes"] == max(step["peak_bytes"] for step in record["kept"]["steps"])
    (run,) = record["runs"]
    assert [step["rows"] for step in run["steps"]] == [4, 3, 2, 4]  # the first step profiles
    assert "scaled" in {step["source"] for step in run["steps"]}
    for step in run["steps"]:
        assert step["peak_bytes"] <= step["predicted_peak_bytes"]


def test_rows_beyond_the_batch_are_refused():
    with pytest.raises(SystemExit, match="--rows"):
        peak_prediction.main(["--workload", "tiny", "--device", "cpu", "--rows", "8,99"])


def test_a_step_out_of_memory_ends_its_run_with_the_step_and_the_plan_it_ran_under():
    args = peak_prediction.build_parser().parse_args([*SMALL_GPT, "--steps", "4"])
    workload = peak_prediction.workload_from_args(args)
    calls = []

    def loss_out_of_memory_at_the_third_step(model, batch):
        calls.append(None)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.00 MiB.\nmore")
        return workload.loss(model, batch)

    failing = dataclasses.replace(workload, loss=loss_out_of_memory_at_the_third_step)
    run = peak_prediction.session_peaks(failing, torch.device("cpu"), 10**10, "auto", 4)
    assert run["out_of_memory"] == "step 3 (a planned pass): CUDA out of memory. Tried to allocate 14.00 MiB."
    assert run["plan_predicted_peak_bytes"] > 0
    assert len(run["steps"]) == 1  # the profiling pass plans; the second step runs under the plan
    record = {"workload": "gpt", "params": {}, "device": "cpu", "allocator": "x", "kept_peak_bytes": 1}
    table = peak_prediction.markdown({**record, "runs": [{"fraction": "0.5", **run}]})
    assert "| 0.5 | auto | 10.00 GB | out of memory at step 3 (a planned pass)" in table
