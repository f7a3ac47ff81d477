"""Where a profiled step's time went, stream by stream: the pure breakdown on synthetic device
events, reading a profile's events, and the profiled step's glue (on the CPU: no device events)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from bench.row import ResultRow
from bench.runner import _profile_streams
from bench.streams import (
    DeviceActivity,
    busy_seconds,
    device_activities,
    merged,
    overlap_seconds,
    profile_streams,
    stream_breakdown,
    where_line,
)

COMPUTE, COPY = 7, 13
DTOH, HTOD = "Memcpy DtoH (Device -> Pinned)", "Memcpy HtoD (Pinned -> Device)"


def kernel(start: float, end: float, stream: int | None = COMPUTE, name: str = "conv") -> DeviceActivity:
    return DeviceActivity(name, stream, start, end)


def test_busy_time_is_the_union_of_the_intervals() -> None:
    assert busy_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 3.5), (3.1, 3.2)]) == 2.5
    assert busy_seconds([]) == 0.0


def test_two_streams_gaps_and_overlap() -> None:
    activities = [
        kernel(0.0, 2.0),
        kernel(1.0, 3.0, name="relu"),  # overlaps the first: one busy interval 0-3
        kernel(3.25, 4.0),  # a gap of 0.25, below the threshold
        kernel(6.0, 7.0),  # a gap of 2
        kernel(8.0, 10.0),  # a gap of 1
        DeviceActivity(DTOH, COPY, 2.0, 5.0),  # under kernels 2-3 and 3.25-4; idle 3-3.25 and 4-5
        DeviceActivity(HTOD, COPY, 9.0, 11.0),  # under the last kernel 9-10; after the span 10-11
    ]
    figures = stream_breakdown(activities, wall_seconds=12.0, gap_seconds=0.5)
    assert figures.wall_seconds == 12.0
    assert figures.compute_stream == COMPUTE and figures.streams == 2 and figures.streams_known
    assert figures.kernels == 5 and figures.copies == 2
    assert figures.compute_kernel_seconds == 3.0 + 0.75 + 1.0 + 2.0
    assert figures.compute_copy_seconds == 0.0
    assert figures.compute_span_seconds == 10.0
    assert figures.compute_idle_seconds == 10.0 - 6.75 == 0.25 + 2.0 + 1.0
    assert (figures.gaps, figures.gap_seconds, figures.longest_gap_seconds) == (2, 3.0, 2.0)
    assert figures.copy_seconds == 3.0 + 2.0
    assert figures.copy_overlap_seconds == 1.0 + 0.75 + 1.0
    assert figures.idle_with_copies_seconds == 0.25 + 1.0  # the copies ran during two of the gaps
    assert figures.other_kernel_seconds == 0.0
    assert figures.device_busy_seconds == 11.0 - 2.0  # idle 5-6 and 7-8 everywhere
    assert figures.gap_threshold_seconds == 0.5


def test_the_compute_stream_has_the_most_kernel_time_not_the_most_events() -> None:
    many_short = [kernel(start, start + 0.5, stream=3) for start in range(4)]  # 2.0 in four kernels
    activities = [*many_short, kernel(0.0, 3.0), DeviceActivity(DTOH, 3, 0.0, 9.0)]
    figures = stream_breakdown(activities, wall_seconds=10.0)
    assert figures.compute_stream == COMPUTE
    assert figures.compute_kernel_seconds == 3.0
    assert figures.other_kernel_seconds == 2.0
    assert figures.copy_seconds == 9.0  # on stream 3, which is not the compute stream
    assert figures.copy_overlap_seconds == 3.0


def test_copies_on_the_compute_stream_keep_it_busy_and_are_not_side_copies() -> None:
    activities = [kernel(0.0, 1.0), DeviceActivity(HTOD, COMPUTE, 1.0, 2.0), kernel(3.0, 4.0)]
    figures = stream_breakdown(activities, wall_seconds=4.0, gap_seconds=0.5)
    assert figures.compute_copy_seconds == 1.0 and figures.copy_seconds == 0.0
    assert figures.compute_busy_seconds == 3.0 and figures.compute_kernel_seconds == 2.0
    assert figures.compute_idle_seconds == 1.0 and figures.gaps == 1
    assert figures.idle_with_copies_seconds == 0.0


def test_events_without_streams_tell_kernels_from_copies_by_name() -> None:
    activities = [kernel(0.0, 1.0, stream=None), kernel(2.0, 3.0, stream=None)]
    activities.append(DeviceActivity("Memset (Device)", None, 0.5, 2.5))
    figures = stream_breakdown(activities, wall_seconds=3.0, gap_seconds=0.5)
    assert not figures.streams_known and figures.compute_stream is None and figures.streams == 0
    assert figures.compute_kernel_seconds == 2.0 and figures.compute_idle_seconds == 1.0
    assert figures.copy_seconds == 2.0 and figures.idle_with_copies_seconds == 1.0
    assert where_line("oracle", figures.as_dict())[0].startswith(
        "- oracle: step 3000.0 ms under the profiler; all kernels (streams not reported)"
    )


def test_a_step_without_kernels_has_no_compute_stream() -> None:
    figures = stream_breakdown([DeviceActivity(DTOH, COPY, 1.0, 2.0)], wall_seconds=3.0)
    assert figures.compute_stream is None and figures.kernels == 0
    assert figures.compute_span_seconds == figures.compute_idle_seconds == figures.gaps == 0
    assert figures.copy_seconds == 1.0 and figures.copy_overlap_seconds == 0.0
    empty = stream_breakdown([], wall_seconds=1.0)
    assert empty.device_busy_seconds == 0.0 and not empty.streams_known


intervals = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 10)).map(lambda pair: (pair[0], pair[0] + pair[1])),
    max_size=8,
)


@given(intervals, intervals)
def test_union_and_overlap_agree_with_counting_unit_cells(first, second) -> None:
    cells_first = {cell for start, end in first for cell in range(start, end)}
    cells_second = {cell for start, end in second for cell in range(start, end)}
    union = merged(first)
    assert busy_seconds(first) == len(cells_first)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(union))  # disjoint, sorted, not touching
    assert overlap_seconds(union, merged(second)) == len(cells_first & cells_second)


def test_device_activities_reads_kernels_and_copies_with_their_streams() -> None:
    def event(name: str, device: DeviceType, stream: int, start: int, end: int, **extra) -> FunctionEvent:
        return FunctionEvent(
            id=0,
            name=name,
            thread=1,
            start_us=start,
            end_us=end,
            device_type=device,
            device_resource_id=stream,
            **extra,
        )

    events = [
        event("aten::conv2d", DeviceType.CPU, 1, 0, 100),
        event("cudnn_conv", DeviceType.CUDA, COMPUTE, 10, 60),
        event(DTOH, DeviceType.CUDA, COPY, 20, 80),
        event("my_range", DeviceType.CUDA, COMPUTE, 0, 100, is_user_annotation=True),
        event("Stream Wait Event", DeviceType.CUDA, COMPUTE, 60, 61),
    ]
    assert device_activities(events) == [
        DeviceActivity("cudnn_conv", COMPUTE, 10e-6, 60e-6),
        DeviceActivity(DTOH, COPY, 20e-6, 80e-6),
    ]


def test_profiling_a_step_on_the_cpu_finds_no_device_activity() -> None:
    x = torch.randn(16, 16)
    figures = profile_streams(lambda: float((x @ x).sum()) * 0.0 + 0.25)
    assert figures["wall_seconds"] == 0.25  # what the step returned: its own wall time
    assert figures["kernels"] == figures["copies"] == 0 and figures["compute_stream"] is None
    assert where_line("oracle", None) == [] and where_line("oracle", {}) == []


def test_a_row_keeps_its_profiled_step_figures_or_a_note_when_it_fails() -> None:
    row = ResultRow("accudnn-2x", "accudnn", status="ok")

    def failing() -> dict[str, Any]:
        raise RuntimeError("out of something")

    _profile_streams(row, failing, {})
    assert row.streams is None and row.status == "ok"
    assert row.notes == ["profiled step: RuntimeError: out of something"]
    figures = {"step_seconds": 0.5, "timed": False, "observed": True, "wait_seconds": 0.0, "plan_id": 3}
    _profile_streams(row, lambda: dict(figures), {"plan_id": 3})
    assert row.streams is not None and row.streams["wall_seconds"] == 0.5
    step = {key: value for key, value in figures.items() if key != "plan_id"}
    assert row.streams["step"] == {**step, "same_plan": True}
    _profile_streams(row, lambda: dict(figures), {"plan_id": 4})
    assert row.streams["step"]["same_plan"] is False
    line = where_line(row.name, row.streams)[0]
    session = "; the session observed this pass whole, waited 0.0 ms for copies"
    assert line.endswith(f"{session}, under a plan other than the measured steps'")


@pytest.mark.parametrize("threshold", [0.1, 1.5])
def test_gaps_at_or_below_the_threshold_are_idle_but_not_counted(threshold: float) -> None:
    activities = [kernel(0.0, 1.0), kernel(2.0, 3.0), kernel(3.5, 4.0)]  # gaps of 1.0 and 0.5
    figures = stream_breakdown(activities, wall_seconds=4.0, gap_seconds=threshold)
    assert figures.compute_idle_seconds == 1.5
    expected = [gap for gap in (1.0, 0.5) if gap > threshold]
    assert (figures.gaps, figures.gap_seconds) == (len(expected), sum(expected))
