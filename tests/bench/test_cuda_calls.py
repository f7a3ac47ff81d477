"""``bench.overhead.cuda_calls``: CudaRuntime's CUDA calls per swapped storage, counted on the CPU.

Counts, not times: the same code counts the same on any machine, so bounds hold exactly. The
deep narrow model is shortened (40 layers); its figures per swapped storage are within a few
hundredths of the full model's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.overhead import cuda_calls
from lightning_accudnn.ops import CudaRuntime


@pytest.fixture(scope="module")
def counted() -> dict:
    return cuda_calls.count_calls(layers=40, passes=2)


@pytest.fixture(scope="module")
def counted_wide() -> dict:
    return cuda_calls.count_calls(layers=40, passes=2, window="wide")


def test_no_event_is_made_and_no_lookup_repeated_per_swapped_storage(counted: dict) -> None:
    per_storage = counted["per_swapped_storage"]
    assert counted["swapped_storages"] > 40
    assert per_storage["events_created"] <= 0.1
    # The device and the compute stream are looked up once per pass, kept or swapped alike.
    assert per_storage["device_lookups"] == 0 and per_storage["stream_lookups"] == 0
    assert counted["calls_per_pass"]["half"]["device_lookups"] <= 2


def test_copies_compute_waits_on_at_once_cost_no_cuda_call(counted: dict) -> None:
    # With a window and a copy-out limit of one layer, each layer's copies out are retired as the
    # next layer saves, and each copy in is read as soon as it is issued: they run on the compute
    # stream. What is left are the few groups compute does not wait on at once: the one the
    # forward's end issues (read in place in backward) and those prefetched while backward
    # still reads kept saves. Each costs two records: far fewer groups than swapped layers.
    assert counted["other_calls_per_swapped_storage"] <= 3.0
    groups = counted["calls_per_pass"]["half"].get("records", 0) / 2
    assert 1 <= groups <= 40 / 8


def test_a_group_of_copies_costs_a_record_and_a_stream_switch_pair_on_each_side(counted_wide: dict) -> None:
    per_storage = counted_wide["per_swapped_storage"]
    # Per group: the compute event recorded and the group's event recorded (two records), the copy
    # stream made current and the compute stream again (two switches), the copy stream's wait on
    # compute; compute's wait on the group at most once.
    assert per_storage["records"] > 0
    assert per_storage["records"] == per_storage["stream_switches"]
    assert per_storage["waits"] <= per_storage["records"]
    # Copies out of small storages span layers and the window brings everything back in one
    # round: far fewer than one group per swapped storage.
    assert per_storage["records"] < 0.5
    assert counted_wide["other_calls_per_swapped_storage"] <= 1.0


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


def test_copies_compute_waits_on_at_once_run_on_compute_unless_a_group_is_pending() -> None:
    cuda = cuda_calls.CountingCuda()
    with cuda.patched():
        runtime = cuda_calls.counting_runtime()
        runtime.timing = False
        runtime.begin_pass()
        source, host, back = torch.arange(8.0), torch.empty(8), torch.empty(8)
        cuda.calls.clear()
        runtime.copy_out_now([source], [host])
        assert not cuda.calls and torch.equal(host, source)
        runtime.copy_out(runtime.record_compute(), [source], [torch.empty(8)])  # not waited on
        cuda.calls.clear()
        runtime.copy_in_now([host], [back])  # on the copy stream, after the pending group
        # The group's event: a second one from the ring, the first being still in flight.
        assert dict(cuda.calls) == {"events_created": 1, "records": 2, "waits": 2, "stream_switches": 2}
        assert torch.equal(back, source)
        cuda.calls.clear()
        runtime.copy_in_now([host], [back])  # compute waited on every group: on compute again
        assert not cuda.calls


class Stalls:
    """A stall listener that keeps the marks it is told of."""

    def __init__(self) -> None:
        self.marks: list[tuple[object, object]] = []

    def stall(self, before: object, after: object) -> None:
        self.marks.append((before, after))


@contextlib.contextmanager
def _timing_runtime() -> Iterator[tuple[cuda_calls.CountingCuda, CudaRuntime, Stalls]]:
    """Inside: the counting stand-ins, a counting runtime timing its waits in a pass, its stall
    listener; no call counted yet."""
    cuda = cuda_calls.CountingCuda()
    with cuda.patched():
        runtime = cuda_calls.counting_runtime()
        runtime.stalls = stalls = Stalls()
        runtime.begin_pass()
        cuda.calls.clear()
        yield cuda, runtime, stalls


def test_copies_compute_waits_on_at_once_are_stalls_while_timing() -> None:
    with _timing_runtime() as (cuda, runtime, stalls):
        runtime.copy_out_now([torch.arange(8.0)], [torch.empty(8)])
    # Two timing events around the copies on compute, given to the layer timer as a stall.
    assert len(stalls.marks) == 1
    assert cuda.calls["events_created"] == 2 and cuda.calls["records"] == 2 and "waits" not in cuda.calls


def test_a_new_host_buffer_is_a_stall_while_timing_and_costs_no_cuda_call_otherwise() -> None:
    with _timing_runtime() as (cuda, runtime, stalls):
        buffer = runtime.allocate_host(64)
        assert buffer.dtype == torch.uint8 and buffer.numel() == 64
        # Two timing events on compute around the allocation, a stall to the layer timer.
        assert len(stalls.marks) == 1
        assert dict(cuda.calls) == {"events_created": 2, "records": 2}
        runtime.timing = False
        cuda.calls.clear()
        runtime.allocate_host(64)
    assert len(stalls.marks) == 1 and not cuda.calls
