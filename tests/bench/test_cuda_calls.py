"""``bench.overhead.cuda_calls``: CudaRuntime's CUDA calls per swapped storage, counted on the CPU.

Counts, not times: the same code counts the same on any machine, so bounds hold exactly. The
deep narrow model is shortened (40 layers); its figures per swapped storage are within a few
hundredths of the full model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.overhead import cuda_calls
from lightning_accudnn.ops import CudaRuntime


@pytest.fixture(scope="module")
def counted() -> dict:
    return cuda_calls.count_calls(layers=40, passes=2)


def test_no_event_is_made_and_no_lookup_repeated_per_swapped_storage(counted: dict) -> None:
    per_storage = counted["per_swapped_storage"]
    assert counted["swapped_storages"] > 40
    assert per_storage["events_created"] <= 0.1
    # The device and the compute stream are looked up once per pass, kept or swapped alike.
    assert per_storage["device_lookups"] == 0 and per_storage["stream_lookups"] == 0
    assert counted["calls_per_pass"]["half"]["device_lookups"] <= 2


def test_a_group_of_copies_costs_one_record_and_one_stream_switch_pair_on_each_side(counted: dict) -> None:
    per_storage = counted["per_swapped_storage"]
    # Per group: the compute event recorded and the group's event recorded (two records), the copy
    # stream made current and the compute stream again (two switches), the copy stream's wait on
    # compute; compute's wait on the group at most once.
    assert per_storage["records"] == per_storage["stream_switches"]
    assert per_storage["waits"] <= per_storage["records"]
    # Copies in come back one layer at a time (the window); copies out of small storages span
    # layers: fewer than two groups per swapped storage (one group per storage and way before).
    assert per_storage["records"] < 2.0
    assert counted["other_calls_per_swapped_storage"] <= 5.0


def test_the_counters_are_removed_after_the_run_and_a_result_is_written(tmp_path: Path) -> None:
    event_type = torch.cuda.Event
    result = cuda_calls.main(["--layers", "4", "--passes", "1", "--results-dir", str(tmp_path)])
    assert torch.cuda.Event is event_type
    (path,) = (tmp_path / "cpu").glob("*-cuda-calls.json")
    written = json.loads(path.read_text())
    assert written["label"].startswith("CPU") and written["environment"]["device"] == "cpu"
    assert written["per_swapped_storage"] == result["per_swapped_storage"]


def test_the_counted_runtime_is_the_real_one() -> None:
    cuda = cuda_calls.CountingCuda()
    with cuda.patched():
        runtime = cuda_calls.counting_runtime()
    assert type(runtime) is CudaRuntime
