"""Where the host's time goes when the engine swaps, on this machine's device: an engine-only profile.

    python -m bench.overhead.hostprofile                  # CPU: the engine's Python alone
    python -m bench.overhead.hostprofile --device cuda    # a GPU host: the engine and CudaRuntime
    python -m bench.overhead.hostprofile --window layer   # prefetch rounds of one layer, as planned

Two engine-only passes of the deep narrow model (:class:`~bench.overhead.engine_passes.EnginePasses`:
no Lightning), one keeping everything and one with the first half of its saving layers swapped,
are run interleaved, each synchronised at its start and end. The half-swapped pass prefetches
through a wide window (every swapped storage copied in as one group at the start of backward) or,
with ``--window layer``, through a window of one layer: what the planner chooses for this model at
``bench.overhead``'s half budget, where each swapped storage comes back in a round of its own (a
placement, an event and a copy each) as it does through Lightning there. The result gives:

- each pass's median time, and the wall-clock µs per swapped storage (the difference, over the
  storages the half-swapped pass swaps), and the same split by phase of the pass (host clock
  only: the forward pass, the end of the forward block with the first prefetch round, the
  backward pass, the end of the step; :data:`~bench.overhead.engine_passes.PHASES`);
- the runtime calls per pass (events recorded on compute, groups of copies out and in, compute
  waits on an event), counted in separate passes through a counting runtime;
- cProfile's µs per swapped storage by function (half-swapped passes less keeping ones): on a GPU
  host this is where PyTorch's own CUDA wrappers show, beside the engine.

Writes ``<results-dir>/<device>/<date>-<name>.json`` with the environment. A CPU figure is a CPU
figure; the GPU host's matter for projecting the host cost onto a GPU step.

Example:
    >>> result = profile_host(torch.device("cpu"), layers=4, passes=2, profiled=1)
    >>> result["swapped_storages"] > 0 and result["runtime_calls_per_pass"]["keep"]["copy_out"] == 0
    True
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.environment import resolve_device
from bench.measure import synchronize
from bench.overhead.engine_passes import PHASES, VARIANTS, EnginePasses
from bench.overhead.spread import Spread
from bench.report import write_result
from lightning_accudnn.ops import Runtime, StallListener, StreamEvent, make_runtime

TOP_FUNCTIONS = 30


class CountingRuntime:
    """Another runtime's calls, counted (the wrapped runtime does the work).

    Example:
        >>> runtime = CountingRuntime(make_runtime(torch.device("cpu")))
        >>> _ = runtime.record_compute()
        >>> dict(runtime.calls)
        {'record_compute': 1}
    """

    def __init__(self, inner: Runtime) -> None:
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()
        self.device = inner.device
        self.pin_memory = inner.pin_memory
        self.tracks_blocks = inner.tracks_blocks

    @property
    def timing(self) -> bool:
        return self.inner.timing

    @timing.setter
    def timing(self, value: bool) -> None:
        self.inner.timing = value

    @property
    def stalls(self) -> StallListener | None:
        return self.inner.stalls

    @stalls.setter
    def stalls(self, listener: StallListener | None) -> None:
        self.inner.stalls = listener

    def begin_pass(self) -> None:
        self.inner.begin_pass()

    def record_compute(self) -> StreamEvent:
        self.calls["record_compute"] += 1
        return self.inner.record_compute()

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        self.calls["copy_out"] += 1
        return self.inner.copy_out(after, sources, hosts)

    def copy_out_now(self, sources: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
        self.calls["copy_out_now"] += 1
        self.inner.copy_out_now(sources, hosts)

    def copy_in_now(self, hosts: list[torch.Tensor], dests: list[torch.Tensor]) -> None:
        self.calls["copy_in_now"] += 1
        self.inner.copy_in_now(hosts, dests)

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        self.calls["allocate"] += 1
        return self.inner.allocate(shape, stride, dtype)

    def allocate_host(self, nbytes: int) -> torch.Tensor:
        self.calls["allocate_host"] += 1
        return self.inner.allocate_host(nbytes)

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        self.calls["copy_in"] += 1
        return self.inner.copy_in(after, hosts, dests)

    def wait(self, event: StreamEvent) -> None:
        self.calls["wait"] += 1
        self.inner.wait(event)

    def use_on_compute(self, data: torch.Tensor, ready: StreamEvent | None) -> None:
        self.calls["use_on_compute" if ready is None else "use_on_compute_after_wait"] += 1
        self.inner.use_on_compute(data, ready)

    def hold(self, key: int, nbytes: int) -> None:
        self.inner.hold(key, nbytes)

    def release(self, key: int) -> None:
        self.inner.release(key)

    def release_host(self, host: torch.Tensor) -> None:
        self.inner.release_host(host)

    def collect_wait_seconds(self) -> float:
        return self.inner.collect_wait_seconds()


def _runtime_calls(device: torch.device, layers: int, tight: bool) -> dict[str, dict[str, int]]:
    runtimes = {variant: CountingRuntime(make_runtime(device)) for variant in VARIANTS}
    passes = EnginePasses.deep_narrow(device, layers=layers, runtimes=dict(runtimes), tight=tight)
    try:
        counted = {}
        for variant in VARIANTS:
            calls = runtimes[variant].calls
            calls.clear()
            passes.run(variant)
            counted[variant] = {name: calls[name] for name in sorted(calls)}
            counted[variant].setdefault("copy_out", 0)
        return counted
    finally:
        passes.close()


def _by_function(profiler: cProfile.Profile) -> dict[str, tuple[int, float]]:
    """Calls and own seconds per function (``file:function``)."""
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    return {f"{Path(key[0]).name}:{key[2]}": (value[1], value[2]) for key, value in stats.items()}


def profile_host(
    device: torch.device, layers: int = 333, passes: int = 10, profiled: int = 5, *, tight: bool = False
) -> dict[str, Any]:
    """The figures of the module docstring for ``device``, as plain data; ``tight``: the
    half-swapped schedule has the planner's window of one layer (see :class:`EnginePasses`)."""
    engine_passes = EnginePasses.deep_narrow(device, layers=layers, tight=tight)
    try:
        seconds: dict[str, list[float | None]] = {variant: [] for variant in VARIANTS}
        phase_seconds: dict[str, dict[str, list[float | None]]] = {
            variant: {phase: [] for phase in PHASES} for variant in VARIANTS
        }
        storages = 0
        for _ in range(passes):
            for variant in VARIANTS:
                synchronize(device)
                start = time.perf_counter()
                stats, phases = engine_passes.run_phases(variant)
                synchronize(device)
                seconds[variant].append(time.perf_counter() - start)
                for phase, value in phases.items():
                    phase_seconds[variant][phase].append(value)
                if variant == "half":
                    storages = stats.storages_swapped_out
        functions = {}
        for variant in VARIANTS:
            profiler = cProfile.Profile()
            synchronize(device)
            profiler.enable()
            for _ in range(profiled):
                engine_passes.run(variant)
            synchronize(device)
            profiler.disable()
            functions[variant] = _by_function(profiler)
    finally:
        engine_passes.close()
    per_storage = profiled * storages
    rows: list[dict[str, Any]] = []
    for name, (calls, own) in functions["half"].items():
        kept_calls, kept_own = functions["keep"].get(name, (0, 0.0))
        rows.append(
            {
                "function": name,
                "us_per_swapped_storage": round((own - kept_own) * 1e6 / per_storage, 3),
                "calls_per_swapped_storage": round((calls - kept_calls) / per_storage, 3),
            }
        )
    rows.sort(key=lambda row: -row["us_per_swapped_storage"])
    medians = {variant: Spread.of(values) for variant, values in seconds.items()}
    keep, half = medians["keep"], medians["half"]
    assert keep is not None and half is not None
    by_phase = {}
    for phase in PHASES:
        kept_phase, half_phase = (Spread.of(phase_seconds[variant][phase]) for variant in VARIANTS)
        assert kept_phase is not None and half_phase is not None
        by_phase[phase] = round((half_phase.median - kept_phase.median) * 1e6 / storages, 2)
    return {
        "kind": "bench.overhead.hostprofile",
        "layers": layers,
        "prefetch_window": "one layer" if tight else "wide",
        "passes": passes,
        "profiled_passes": profiled,
        "swapped_storages": storages,
        "pass_ms": {variant: spread.scaled(1e3).as_dict() for variant, spread in medians.items() if spread},
        "us_per_swapped_storage": (half.median - keep.median) * 1e6 / storages,
        "us_per_swapped_storage_by_phase": by_phase,
        "runtime_calls_per_pass": _runtime_calls(device, layers, tight),
        "profile_us_per_swapped_storage_total": round(sum(row["us_per_swapped_storage"] for row in rows), 2),
        "profile_by_function": rows[:TOP_FUNCTIONS],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help='"cpu" (default), "cuda" or "cuda:N"')
    parser.add_argument("--layers", type=int, default=333)
    parser.add_argument("--passes", type=int, default=10, help="timed passes of each variant")
    parser.add_argument("--profiled", type=int, default=5, help="passes of each variant under cProfile")
    parser.add_argument("--results-dir", type=Path, default=None, help="also write JSON under DIR/<device>/")
    parser.add_argument(
        "--window",
        choices=("wide", "layer"),
        default="wide",
        help="the half-swapped pass's prefetch window: wide (one copy-in group) or one layer's bytes "
        "(what the planner chooses at bench.overhead's half budget: a prefetch round per storage)",
    )
    parser.add_argument("--name", default="hostprofile")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    result = profile_host(device, args.layers, args.passes, args.profiled, tight=args.window == "layer")
    keep, half = result["pass_ms"]["keep"], result["pass_ms"]["half"]
    print(
        f"{device}, prefetch window {result['prefetch_window']}: median pass {keep['median']:.1f} ms keeping "
        f"everything, {half['median']:.1f} ms half "
        f"swapped ({result['swapped_storages']} storages): {result['us_per_swapped_storage']:.1f} µs per "
        f"swapped storage (wall clock)"
    )
    phases = ", ".join(f"{phase} {us:.1f}" for phase, us in result["us_per_swapped_storage_by_phase"].items())
    print(f"host µs per swapped storage by phase (medians, half swapped less keeping): {phases}")
    print(f"runtime calls per pass: {result['runtime_calls_per_pass']}")
    print("cProfile, µs per swapped storage (half swapped less keeping), calls per swapped storage:")
    for row in result["profile_by_function"]:
        us, calls = row["us_per_swapped_storage"], row["calls_per_swapped_storage"]
        print(f"  {us:8.2f}  {calls:6.2f}  {row['function']}")
    print(f"  total {result['profile_us_per_swapped_storage_total']}")
    if args.results_dir is not None:
        write_result(args.results_dir, device, args.name, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
