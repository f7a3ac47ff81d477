"""Where one training step's time went on the device, stream by stream, from ``torch.profiler``.

A step slower than its kernels can have spent the difference four ways: its kernels ran longer,
the compute stream sat idle while the host issued the next kernels (Python hooks, dispatch), it
waited on copies, or copies contended with it. One step run under ``torch.profiler`` (the CUDA
activity alone, so that the host's operators are not timed: :data:`PROFILER_ACTIVITIES`) gives
every kernel, copy and memset the device ran, on its stream; :func:`stream_breakdown` turns them
into figures that tell those apart:

* the **compute stream**: the stream with the most kernel time; its busy time (the union of
  what ran on it), split into kernels and copies or memsets on it, its span (first start to
  last end) and the idle time inside that span, with the gaps longer than ``gap_seconds``
  (count, sum, longest);
* **copies**: the union of memcpy and memset activity on the other streams (a side copy
  stream's ``Memcpy DtoH (Device -> Pinned)``, ``Memcpy HtoD (Pinned -> Device)``), how much
  of it ran under the compute stream's kernels (overlap: hidden) and how much while the compute
  stream was idle inside its span (what a compute stream waiting on copies shows);
* the kernels of the other streams.

Every figure is in seconds. :func:`profile_streams` runs one step under the profiler and
returns them with the step's host wall time; :func:`device_activities` reads a profile's
device events; :func:`stream_breakdown` is pure, for testing on synthetic events.

Example:
    >>> activities = [
    ...     DeviceActivity("gemm", 7, 0.0, 0.004),
    ...     DeviceActivity("relu", 7, 0.005, 0.006),
    ...     DeviceActivity("Memcpy DtoH (Device -> Pinned)", 9, 0.003, 0.0055),
    ... ]
    >>> figures = stream_breakdown(activities, wall_seconds=0.0065)
    >>> figures.compute_stream, round(figures.compute_idle_seconds * 1e3, 3), figures.gaps
    (7, 1.0, 1)
    >>> round(figures.copy_overlap_seconds * 1e3, 3), round(figures.idle_with_copies_seconds * 1e3, 3)
    (1.5, 1.0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: A compute-stream gap longer than this is counted (seconds): kernels issued back to back by a
#: host that keeps ahead leave gaps of a few microseconds.
GAP_SECONDS = 50e-6

#: What :func:`profile_streams` records where CUDA is available: the device's kernels, copies and
#: memsets alone. With the CPU activity too, the profiler times every operator on the host, which
#: slows a host-bound step and so the gaps it is read for (``bench.calibration``'s plain ResNet-152,
#: batch 64, bf16, on an H200: forward and backward took 84.2 ms profiled with both, against a
#: 59.5 ms median).
PROFILER_ACTIVITIES = ("CUDA",)

#: Names of device activity that is neither a kernel nor a copy: CUDA synchronisation records
#: (only with the profiler's experimental ``enable_cuda_sync_events``) and annotations.
_NOT_WORK = ("Stream Wait Event", "Event Sync", "Stream Sync", "Context Sync", "Device Sync")

_COPY_PREFIXES = ("Memcpy", "Memset")


Interval = tuple[float, float]


@dataclass(frozen=True)
class DeviceActivity:
    """One kernel, copy or memset the device ran: its name, stream (``None`` where the profiler
    does not say) and start and end in seconds.

    Example:
        >>> DeviceActivity("Memcpy HtoD (Pinned -> Device)", 13, 1.0, 2.0).is_copy
        True
        >>> DeviceActivity("void cudnn::conv_kernel<...>", 7, 1.0, 2.0).is_copy
        False
    """

    name: str
    stream: int | None
    start_seconds: float
    end_seconds: float

    @property
    def is_copy(self) -> bool:
        """A memcpy or memset (``Memcpy DtoH (Device -> Pinned)``, ``Memset (Device)``...)."""
        return self.name.startswith(_COPY_PREFIXES)

    @property
    def interval(self) -> Interval:
        return (self.start_seconds, self.end_seconds)


@dataclass(frozen=True)
class StreamBreakdown:
    """The figures of :func:`stream_breakdown`, in seconds (see the module's docstring).

    ``streams_known`` is ``False`` when the events named no stream: then every kernel counts as
    the compute stream's and every copy as another stream's (kinds told apart by name only).

    Example:
        >>> figures = stream_breakdown([DeviceActivity("k", 1, 0.0, 1.0)], wall_seconds=1.5)
        >>> figures.compute_kernel_seconds, figures.copy_seconds, figures.compute_idle_seconds
        (1.0, 0.0, 0.0)
    """

    wall_seconds: float
    compute_stream: int | None
    streams: int
    streams_known: bool
    kernels: int
    copies: int
    device_busy_seconds: float
    compute_kernel_seconds: float
    compute_copy_seconds: float
    compute_busy_seconds: float
    compute_span_seconds: float
    compute_idle_seconds: float
    gap_threshold_seconds: float
    gaps: int
    gap_seconds: float
    longest_gap_seconds: float
    copy_seconds: float
    copy_overlap_seconds: float
    idle_with_copies_seconds: float
    other_kernel_seconds: float

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the JSON, fields in declaration order."""
        return dataclasses.asdict(self)


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals.

    Example:
        >>> merged([(3.0, 4.0), (0.0, 2.0), (1.0, 2.5)])
        [(0.0, 2.5), (3.0, 4.0)]
    """
    union: list[Interval] = []
    for start, end in sorted(intervals):
        if union and start <= union[-1][1]:
            if end > union[-1][1]:
                union[-1] = (union[-1][0], end)
        else:
            union.append((start, end))
    return union


def busy_seconds(intervals: Iterable[Interval]) -> float:
    """The length of the union of ``(start, end)`` intervals.

    Example:
        >>> busy_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
        4.0
    """
    return sum((end - start for start, end in merged(intervals)), 0.0)


def overlap_seconds(first: Sequence[Interval], second: Sequence[Interval]) -> float:
    """The length of the intersection of two unions of intervals, each given merged
    (:func:`merged`).

    Example:
        >>> overlap_seconds([(0.0, 2.0), (3.0, 5.0)], [(1.0, 4.0)])
        2.0
    """
    total, index = 0.0, 0
    for start, end in first:
        while index < len(second) and second[index][1] <= start:
            index += 1
        probe = index
        while probe < len(second) and second[probe][0] < end:
            total += min(end, second[probe][1]) - max(start, second[probe][0])
            probe += 1
    return total


def stream_breakdown(
    activities: Sequence[DeviceActivity], wall_seconds: float, gap_seconds: float = GAP_SECONDS
) -> StreamBreakdown:
    """Where a step of ``wall_seconds`` (host, device synchronised at both ends) went on the
    device, from the kernels, copies and memsets it ran (see the module's docstring).

    The compute stream is the stream with the most kernel time (union of its kernels); a step
    that ran no kernel has none, and all its figures but the copies' are 0.

    Example:
        >>> activities = [DeviceActivity("a", 7, 0.0, 1.0), DeviceActivity("b", 7, 3.0, 4.0),
        ...               DeviceActivity("Memcpy DtoH (Device -> Pinned)", 9, 0.5, 2.0)]
        >>> figures = stream_breakdown(activities, wall_seconds=4.5, gap_seconds=0.5)
        >>> figures.compute_idle_seconds, figures.gaps, figures.copy_seconds
        (2.0, 1, 1.5)
        >>> figures.copy_overlap_seconds, figures.idle_with_copies_seconds
        (0.5, 1.0)
    """
    streams_known = any(activity.stream is not None for activity in activities)
    kernels = [activity for activity in activities if not activity.is_copy]
    copies = [activity for activity in activities if activity.is_copy]
    kernel_time: dict[int | None, float] = {}
    for stream in {activity.stream for activity in kernels}:
        kernel_time[stream] = busy_seconds(a.interval for a in kernels if a.stream == stream)
    compute = max(kernel_time, key=lambda stream: kernel_time[stream], default=None)
    has_compute = bool(kernel_time)

    def on_compute(activity: DeviceActivity) -> bool:
        return has_compute and streams_known and activity.stream == compute

    compute_kernels = merged(a.interval for a in kernels if a.stream == compute and has_compute)
    compute_copies = merged(a.interval for a in copies if on_compute(a))
    compute_busy = merged([*compute_kernels, *compute_copies])
    side_copies = merged(a.interval for a in copies if not on_compute(a))
    gaps = [(end, start) for (_, end), (start, _) in zip(compute_busy, compute_busy[1:], strict=False)]
    long_gaps = [end - start for start, end in gaps if end - start > gap_seconds]
    span = compute_busy[-1][1] - compute_busy[0][0] if compute_busy else 0.0
    busy = busy_seconds(compute_busy)
    return StreamBreakdown(
        wall_seconds=wall_seconds,
        compute_stream=compute if streams_known else None,
        streams=len({activity.stream for activity in activities}) if streams_known else 0,
        streams_known=streams_known,
        kernels=len(kernels),
        copies=len(copies),
        device_busy_seconds=busy_seconds(activity.interval for activity in activities),
        compute_kernel_seconds=busy_seconds(compute_kernels),
        compute_copy_seconds=busy_seconds(compute_copies),
        compute_busy_seconds=busy,
        compute_span_seconds=span,
        compute_idle_seconds=span - busy,
        gap_threshold_seconds=gap_seconds,
        gaps=len(long_gaps),
        gap_seconds=sum(long_gaps, 0.0),
        longest_gap_seconds=max(long_gaps, default=0.0),
        copy_seconds=busy_seconds(side_copies),
        copy_overlap_seconds=overlap_seconds(side_copies, compute_kernels),
        idle_with_copies_seconds=overlap_seconds(side_copies, gaps),
        other_kernel_seconds=busy_seconds(a.interval for a in kernels if a.stream != compute),
    )


def device_activities(events: Iterable[Any]) -> list[DeviceActivity]:
    """The kernels, copies and memsets among a profile's events (``profiler.events()``:
    ``FunctionEvent`` objects whose ``device_type`` is CUDA), with their stream
    (``device_resource_id``) and times in seconds; annotations and synchronisation records
    are left out.

    Example:
        >>> from torch.autograd import DeviceType
        >>> from torch.autograd.profiler_util import FunctionEvent
        >>> kernel = FunctionEvent(id=0, name="gemm", thread=1, start_us=10, end_us=40,
        ...                        device_type=DeviceType.CUDA, device_resource_id=7)
        >>> host = FunctionEvent(id=1, name="aten::mm", thread=1, start_us=0, end_us=50)
        >>> device_activities([kernel, host])
        [DeviceActivity(name='gemm', stream=7, start_seconds=1e-05, end_seconds=4e-05)]
    """
    activities = []
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(event, "is_user_annotation", False) or event.name.startswith(_NOT_WORK):
            continue
        if getattr(event, "activity_type", None) in ("gpu_user_annotation", "cuda_sync"):
            continue
        stream = getattr(event, "device_resource_id", None)
        activities.append(
            DeviceActivity(
                event.name,
                None if stream is None else int(stream),
                event.time_range.start / 1e6,
                event.time_range.end / 1e6,
            )
        )
    return activities


def profiler_activities() -> list[torch.profiler.ProfilerActivity]:
    """:data:`PROFILER_ACTIVITIES` where CUDA is available; elsewhere the CPU's (there are no
    device events to read: only for the profiled step to run).

    Example:
        >>> expected = "CUDA" if torch.cuda.is_available() else "CPU"
        >>> [activity.name for activity in profiler_activities()] == [expected]
        True
    """
    names = PROFILER_ACTIVITIES if torch.cuda.is_available() else ("CPU",)
    return [getattr(torch.profiler.ProfilerActivity, name) for name in names]


def profiled_events(run: Callable[[], float]) -> tuple[float, list[Any]]:
    """Call ``run`` (one step, returning its host wall seconds) under ``torch.profiler`` with
    :func:`profiler_activities`, no shapes, stacks or memory; its wall seconds and the profile's
    events."""
    with torch.profiler.profile(
        activities=profiler_activities(), record_shapes=False, with_stack=False, profile_memory=False
    ) as profiler:
        wall = run()
    return wall, list(profiler.events())


def profile_streams(run: Callable[[], float], gap_seconds: float = GAP_SECONDS) -> dict[str, Any]:
    """Run one step (``run``, returning its host wall seconds, the device synchronised at both
    ends) under ``torch.profiler``; :func:`stream_breakdown` of it as plain data."""
    wall, events = profiled_events(run)
    return stream_breakdown(device_activities(events), wall, gap_seconds).as_dict()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def where_line(name: str, streams: dict[str, Any] | None) -> list[str]:
    """A Markdown list item saying where a row's profiled step went (none without figures).

    Example:
        >>> activities = [DeviceActivity("k", 7, 0.0, 0.010), DeviceActivity("k", 7, 0.012, 0.020),
        ...               DeviceActivity("Memcpy DtoH (Device -> Pinned)", 9, 0.005, 0.015)]
        >>> (line,) = where_line("accudnn-2x", stream_breakdown(activities, wall_seconds=0.021).as_dict())
        >>> import re
        >>> print(*re.split("[;,] ", line), sep="\\n")
        - accudnn-2x: step 21.0 ms under the profiler
        compute stream 7: kernels 18.0 ms
        copies 0.0 ms
        idle 2.0 ms of its 20.0 ms span (1 gaps > 50 µs: 2.0 ms
        longest 2.0 ms
        copies ran during 2.0 ms of that idle)
        copies on other streams 10.0 ms
        8.0 ms of it under compute kernels
        kernels on other streams 0.0 ms
    """
    if not streams:
        return []
    stream = streams["compute_stream"]
    where = f"compute stream {stream}" if streams["streams_known"] else "all kernels (streams not reported)"
    return [
        f"- {name}: step {_ms(streams['wall_seconds'])} ms under the profiler; {where}: kernels "
        f"{_ms(streams['compute_kernel_seconds'])} ms, copies {_ms(streams['compute_copy_seconds'])} ms, "
        f"idle {_ms(streams['compute_idle_seconds'])} ms of its {_ms(streams['compute_span_seconds'])} ms "
        f"span ({streams['gaps']} gaps > {streams['gap_threshold_seconds'] * 1e6:.0f} µs: "
        f"{_ms(streams['gap_seconds'])} ms, longest {_ms(streams['longest_gap_seconds'])} ms; copies ran "
        f"during {_ms(streams['idle_with_copies_seconds'])} ms of that idle); copies on other streams "
        f"{_ms(streams['copy_seconds'])} ms, {_ms(streams['copy_overlap_seconds'])} ms of it under compute "
        f"kernels; kernels on other streams {_ms(streams['other_kernel_seconds'])} ms"
        + _session_pass(streams.get("step") or {})
    ]


def _session_pass(step: dict[str, Any]) -> str:
    """What kind of pass an offload session ran in the profiled step, where its figures say:
    timed layer by layer and observed whole passes are slower than the replayed ones.

    Example:
        >>> _session_pass({"timed": False, "observed": True, "wait_seconds": 0.002, "same_plan": True})
        '; the session observed this pass whole, waited 2.0 ms for copies'
        >>> _session_pass({"step_seconds": 0.1})
        ''
    """
    if "timed" not in step:
        return ""
    kind = "timed it layer by layer" if step["timed"] else None
    kind = kind or ("observed this pass whole" if step.get("observed") else "replayed this pass")
    text = f"; the session {kind}"
    if step.get("wait_seconds") is not None:
        text += f", waited {_ms(step['wait_seconds'])} ms for copies"
    if step.get("same_plan") is False:
        text += ", under a plan other than the measured steps'"
    return text
