"""The CUDA calls ``CudaRuntime`` makes per swapped storage, counted on the CPU.

    python -m bench.overhead.cuda_calls                 # 333 layers, window of one layer
    python -m bench.overhead.cuda_calls --window wide   # every swapped storage back in one round

``torch.cuda``'s events, streams, stream switches and device and stream lookups are replaced by
counters (:class:`CountingCuda`) for the length of the run, and ``CudaRuntime`` itself runs on
CPU tensors: its copies are CPU copies, every call it makes to ``torch.cuda`` is counted. The
workload is :class:`~bench.overhead.engine_passes.EnginePasses`' deep narrow model (no
Lightning), replayed in the steady state with the first half of its saving layers swapped and,
by default, a prefetch window and a copy-out limit of one layer (what the planner chooses for it
at ``bench.overhead``'s half budget). The result gives, per swapped storage of the half-swapped
pass less those of the pass keeping everything: events created (each a ``cudaEventCreate`` at its
first record and a ``cudaEventDestroy`` when collected), event records, waits (a stream waiting
on an event), stream switches (``set_stream``), current-device lookups and current-stream lookups.
``other_calls`` is the sum of all of them but the events created. Counts, not times: the same
code counts the same on any machine; on a GPU host each call costs a few µs.

Writes ``<results-dir>/cpu/<date>-<name>.json`` with the environment (labelled CPU).

Example:
    >>> result = count_calls(layers=4, passes=1)
    >>> result["swapped_storages"] > 0 and result["per_swapped_storage"]["events_created"] >= 0
    True
"""

from __future__ import annotations

import argparse
import collections
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.overhead.engine_passes import VARIANTS, EnginePasses
from bench.report import write_result
from lightning_accudnn.ops import CudaRuntime

#: What is counted, per swapped storage in the result.
CALLS = ("events_created", "records", "waits", "stream_switches", "device_lookups", "stream_lookups")
LABEL = (
    "CPU: torch.cuda replaced by counters, CudaRuntime's copies done on the CPU. Call counts per "
    "swapped storage, not times; no GPU was used."
)


class CountingCuda:
    """Stand-ins for the ``torch.cuda`` names ``CudaRuntime`` uses, counting every call.

    Example:
        >>> cuda = CountingCuda()
        >>> with cuda.patched():
        ...     event = torch.cuda.Event()
        ...     event.record(torch.cuda.current_stream())
        >>> dict(cuda.calls)
        {'events_created': 1, 'stream_lookups': 1, 'records': 1}
    """

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        counter = self.calls
        state = self

        class Stream:
            """A stream: an id; waits and records counted."""

            def __init__(
                self,
                device: object = None,
                priority: int = 0,
                stream_id: int | None = None,
                device_index: int | None = None,
                device_type: int | None = None,
            ) -> None:
                if stream_id is None:
                    state.streams += 1
                    stream_id = state.streams
                self.stream_id = stream_id
                self.device_index = 0
                self.device_type = 1
                self.device = torch.device("cuda", 0)

            def __eq__(self, other: object) -> bool:
                return isinstance(other, Stream) and other.stream_id == self.stream_id

            def __hash__(self) -> int:
                return hash(self.stream_id)

            def wait_event(self, event: Event) -> None:
                counter["waits"] += 1

            def record_event(self, event: Event | None = None) -> Event:
                event = Event() if event is None else event
                event.record(self)
                return event

            def synchronize(self) -> None:
                pass

        class Event:
            """An event: made, recorded, waited on; all counted."""

            def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
                counter["events_created"] += 1

            def record(self, stream: Stream | None = None) -> None:
                if stream is None:
                    state.current_stream_lookup()
                counter["records"] += 1

            def wait(self, stream: Stream | None = None) -> None:
                if stream is None:
                    state.current_stream_lookup()
                counter["waits"] += 1

            def query(self) -> bool:
                return True

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: Event) -> float:
                return 0.0

        self.Stream = Stream
        self.Event = Event
        self.streams = 0
        self.current = Stream()

    def current_stream_lookup(self) -> Any:
        self.calls["stream_lookups"] += 1
        return self.current

    @contextlib.contextmanager
    def patched(self) -> Iterator[CountingCuda]:
        """Replace ``torch.cuda``'s names (and the current-stream binding) for the block."""
        cuda = self

        def current_stream(device: object = None) -> Any:
            return cuda.current_stream_lookup()

        def get_current_stream(index: int) -> tuple[int, int, int]:
            stream = cuda.current_stream_lookup()
            return stream.stream_id, stream.device_index, stream.device_type

        def set_stream(stream: Any) -> None:
            if stream is not None:
                cuda.calls["stream_switches"] += 1
                cuda.current = stream

        def current_device() -> int:
            cuda.calls["device_lookups"] += 1
            return 0

        @contextlib.contextmanager
        def stream_context(stream: Any) -> Iterator[None]:
            previous = current_stream()
            set_stream(stream)
            try:
                yield
            finally:
                set_stream(previous)

        replacements: list[tuple[object, str, object]] = [
            (torch.cuda, "Event", self.Event),
            (torch.cuda, "Stream", self.Stream),
            (torch.cuda, "current_stream", current_stream),
            (torch.cuda, "set_stream", set_stream),
            (torch.cuda, "current_device", current_device),
            (torch.cuda, "stream", stream_context),
            (torch._C, "_cuda_getCurrentStream", get_current_stream),
        ]
        saved = [(owner, name, getattr(owner, name, None)) for owner, name, _ in replacements]
        for owner, name, value in replacements:
            setattr(owner, name, value)
        try:
            yield self
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)


def counting_runtime() -> CudaRuntime:
    """A ``CudaRuntime`` (made under :meth:`CountingCuda.patched`), its tensors on the CPU, unpinned."""
    runtime = CudaRuntime(torch.device("cuda", 0))
    runtime.device = torch.device("cpu")
    runtime.pin_memory = False
    return runtime


def count_calls(layers: int = 333, passes: int = 5, window: str = "layer") -> dict[str, Any]:
    """Count ``CudaRuntime``'s CUDA calls over ``passes`` steady-state passes of each variant."""
    cuda = CountingCuda()
    totals: dict[str, collections.Counter[str]] = {}
    swapped = 0
    with cuda.patched():
        runtimes = {variant: counting_runtime() for variant in VARIANTS}
        tight = window == "layer"
        engines = EnginePasses.deep_narrow(torch.device("cpu"), layers, dict(runtimes), tight=tight)
        for variant in VARIANTS:
            cuda.calls.clear()
            for _ in range(passes):
                stats = engines.run(variant)
                if variant == "half":
                    swapped += stats.storages_swapped_out
            totals[variant] = collections.Counter(cuda.calls)
        engines.close()
    per_storage = {
        call: (totals["half"][call] - totals["keep"][call]) / swapped if swapped else None for call in CALLS
    }
    others = [call for call in CALLS if call != "events_created"]
    other_calls = sum(per_storage[call] or 0.0 for call in others) if swapped else None
    return {
        "kind": "bench.overhead.cuda_calls",
        "label": LABEL,
        "layers": layers,
        "passes": passes,
        "window": window,
        "swapped_storages": swapped // passes if passes else 0,
        "calls_per_pass": {
            variant: {call: count / passes for call, count in sorted(totals[variant].items())}
            for variant in VARIANTS
        },
        "per_swapped_storage": per_storage,
        "other_calls_per_swapped_storage": other_calls,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead.cuda_calls", description=__doc__)
    parser.add_argument("--layers", type=int, default=333)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--window", choices=("layer", "wide"), default="layer")
    parser.add_argument("--results-dir", type=Path, default=Path("bench/results"))
    parser.add_argument("--name", default="cuda-calls")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    result = count_calls(args.layers, args.passes, args.window)
    path = write_result(args.results_dir, torch.device("cpu"), args.name, result)
    for call, value in result["per_swapped_storage"].items():
        print(f"{call:>16}: {value:.3f} per swapped storage")
    print(f"{'other calls':>16}: {result['other_calls_per_swapped_storage']:.3f} per swapped storage")
    print(f"swapped storages per pass: {result['swapped_storages']}; wrote {path}")
    return result


if __name__ == "__main__":
    main()
