"""The time model against the device: the compute the profiling pass measures, the steps it
predicts, and what the device takes.

    python -m bench.calibration --workload resnet152 --param batch_size=64 --param precision=bf16
    python -m bench.calibration --workload tiny --device cpu --warmup 2 --steps 2   # CI, seconds

For one workload, in one process, three runs of ``--warmup`` + ``--steps`` training steps:

1. **plain**: no strategy. The median step (forward and backward, synchronised wall clock)
   and, on CUDA, one more step under ``torch.profiler``: the time the GPU ran kernels (the
   union of their intervals). A step whose GPU is busy for much less than its wall time is
   *host-bound*: the CPU issuing kernels, not the GPU, sets its pace.
2. **kept**: an ``OffloadSession`` whose budget holds everything (``"auto"``), so the same
   work as plain. What its profiling pass measured (the layers' forward and backward compute,
   summed), the plan's predicted step, and its steady steps' measured time: how far the
   layer-by-layer timing of the profiling pass is from the step it profiles.
3. **fraction**: a session at the model state plus ``--fraction`` of the saved activations
   (as run 2's profile counts them). Its plan (recomputed segments, swapped bytes, predicted
   step and peak) against the measured steady step and peak.

On CUDA each run also records where one step's time went on the device, stream by stream
(``streams``, :mod:`bench.streams`): one more step under ``torch.profiler``, recording the
device's activity alone (the profiled step above records the host's operators too, and runs
slower for it), after the figures above.

On CUDA each session step also records the allocator's retries under the cap, ``cudaMalloc`` and
``cudaFree`` calls and full synchronisations in it (``allocator``), and every session step the
host time it spent planning the passes after it (``planning_seconds``): what makes a step slow
that is neither compute nor copies; and, on the step that adopted a plan made on a planning
thread (``OffloadConfig.plan_in_background``), that thread's time making it
(``background_planning_seconds``: not in the step's time). The warm-up ends waiting for the plans
in the making, so that the steady steps run them.

Each session's plan (``plan``: per layer its bytes, times and choice) and the whole profile it
was made from (``profile``: layers, segments, static bytes, the link's rates) are in the JSON,
so that a GPU's figures can be planned again on a CPU.

Writes ``<results-dir>/<device>/<date>-calibration-<workload>.json`` and ``.md``. The figures
are for writing the time model's calibration down; nothing here changes it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.environment import REPO_ROOT, resolve_device
from bench.measure import allocator_counters, counter_increase, median, now, release_memory, synchronize
from bench.report import fmt_bytes, fmt_ms, write_result
from bench.run import add_workload_arguments, parse_fraction, workload_from_args
from bench.runner import autocast_for, batch_on
from bench.streams import busy_seconds, profile_streams, where_line
from bench.workloads import Batch, Workload
from lightning_accudnn.planner.search import POLICIES
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES, StepProfile
from lightning_accudnn.session import OffloadConfig, OffloadSession


def _batches(workload: Workload, device: torch.device) -> list[Batch]:
    return [batch_on(workload.make_batch(index), device) for index in range(2)]


#: The name of a block's forward range in :func:`block_forward_times`' profile.
BLOCK_PREFIX = "calibration.block:"


def plain_run(workload: Workload, device: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    """Plain training: the median synchronised step and, on CUDA, the GPU's busy time in one step."""
    result = _plain_steps(workload, device, warmup, steps)
    release_memory(device)  # the model and its optimizer are gone with the frame that made them
    return result


def _plain_steps(workload: Workload, device: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    with torch.device(device):
        model = workload.build()
    optimizer = workload.optimizer(model)
    batches = _batches(workload, device)

    def step(index: int) -> float:
        start = now(device)
        with autocast_for(workload, device):
            loss = workload.loss(model, batches[index % 2])
        loss.backward()
        synchronize(device)
        seconds = now(device) - start
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return seconds

    times = [step(index) for index in range(warmup + steps)][warmup:]
    result: dict[str, Any] = {"step_seconds": times, "median_step_seconds": median(times)}
    if device.type == "cuda":
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as profiler:
            wall = step(0)
        kernels = [
            (event.time_range.start / 1e6, event.time_range.end / 1e6)
            for event in profiler.events()
            if event.device_type == torch.autograd.DeviceType.CUDA
        ]
        result["profiled_step_seconds"] = wall
        result["gpu_busy_seconds"] = busy_seconds(kernels)
        result["kernels"] = len(kernels)
        result["blocks"] = block_forward_times(model, workload.blocks(model), lambda: step(1), activities)

        def whole_step() -> float:
            start = now(device)
            step(0)
            return now(device) - start

        result["streams"] = profile_streams(whole_step)
    return result


def block_forward_times(
    model: nn.Module, names: list[str], run: Callable[[], object], activities: list[Any]
) -> list[dict[str, Any]]:
    """Per block that full checkpointing wraps (``names``), in one call of ``run`` under
    ``torch.profiler``: the host time its forward took (the Python and dispatch that issue its
    kernels) and the device time of the kernels it issued (0 without a device among
    ``activities``). Recomputed in backward, a block whose host time passes its device time
    costs its host time: the GPU waits on the CPU to issue it.

    Example:
        >>> from torch.profiler import ProfilerActivity
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        >>> run = lambda: model(torch.randn(2, 8))
        >>> times = block_forward_times(model, ["0"], run, [ProfilerActivity.CPU])
        >>> [(block["name"], block["host_seconds"] > 0, block["device_seconds"]) for block in times]
        [('0', True, 0.0)]
    """
    modules = dict(model.named_modules())
    open_ranges: list[torch.autograd.profiler.record_function] = []

    def enter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: object) -> None:
            block = torch.autograd.profiler.record_function(f"{BLOCK_PREFIX}{name}")
            block.__enter__()
            open_ranges.append(block)

        return hook

    def leave(module: nn.Module, args: object, output: object) -> None:
        open_ranges.pop().__exit__(None, None, None)

    handles = []
    for name in names:
        handles.append(modules[name].register_forward_pre_hook(enter(name)))
        handles.append(modules[name].register_forward_hook(leave))
    try:
        with torch.profiler.profile(activities=activities) as profiler:
            run()
    finally:
        for handle in handles:
            handle.remove()
    times: dict[str, dict[str, Any]] = {}
    for event in profiler.events():
        if event.name.startswith(BLOCK_PREFIX):
            name = event.name[len(BLOCK_PREFIX) :]
            block = times.setdefault(name, {"name": name, "host_seconds": 0.0, "device_seconds": 0.0})
            block["host_seconds"] += event.cpu_time_total / 1e6
            block["device_seconds"] += event.device_time_total / 1e6
    return [times[name] for name in names if name in times]


def session_run(
    workload: Workload,
    device: torch.device,
    budget: int | str,
    warmup: int,
    steps: int,
    plan_in_background: bool = True,
    policy: str = "auto",
) -> dict[str, Any]:
    """Training under an ``OffloadSession`` at ``budget`` (plans under ``policy``): its plan and
    its measured steps, or the error that ended it (a budget too small for the profiling pass,
    say) as ``error``."""
    try:
        result = _session_steps(workload, device, budget, warmup, steps, plan_in_background, policy)
    except Exception as error:  # recorded: the other runs' figures still count
        result = {"steps": [], "error": f"{type(error).__name__}: {error}", "budget_bytes": budget}
    release_memory(device)
    return result


def _session_steps(
    workload: Workload,
    device: torch.device,
    budget: int | str,
    warmup: int,
    steps: int,
    plan_in_background: bool,
    policy: str,
) -> dict[str, Any]:
    torch.manual_seed(0)
    with torch.device(device):
        model = workload.build()
    optimizer = workload.optimizer(model)
    batches = _batches(workload, device)
    min_swap = DEFAULT_MIN_SWAP_BYTES if workload.min_swap_bytes is None else workload.min_swap_bytes
    config = OffloadConfig(
        budget=budget, min_swap_bytes=min_swap, plan_in_background=plan_in_background, policy=policy
    )
    session = OffloadSession(config, device)
    per_step: list[dict[str, Any]] = []

    def one_step(batch: Batch) -> tuple[float, Any]:
        """One session step: its forward and backward's wall seconds and the session's stats."""
        start = now(device)
        with (
            session.step(model, [optimizer], batch=batch, close_on_backward=False),
            autocast_for(workload, device),
        ):
            loss = workload.loss(model, batch)
        session.begin_backward()
        loss.backward()
        stats = session.end_backward()
        synchronize(device)
        wall = now(device) - start
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return wall, stats

    profiled: dict[str, Any] = {}

    def profiled_step() -> float:
        """One more step (its optimizer step too); what the session did in it, in ``profiled``."""
        start = now(device)
        wall, stats = one_step(batches[(warmup + steps) % 2])
        seconds = now(device) - start
        profiled["wall_seconds"] = wall
        if stats is not None:
            profiled.update(
                measured_seconds=stats.step_seconds,
                timed=stats.timed,
                observed=stats.observed,
                wait_seconds=stats.wait_seconds,
                source=None if stats.plan_source is None else stats.plan_source.value,
                same_plan=session.plan is plan,
            )
        return seconds

    streams, streams_error = None, None
    began = now(device)
    try:
        for index in range(warmup + steps):
            counts = allocator_counters(device)
            wall, stats = one_step(batches[index % 2])
            elapsed = now(device) - began
            after = allocator_counters(device)
            if index + 1 == warmup:  # the steady steps run the plans made from the warm-up
                waited = now(device)
                session.wait_for_plans()
                began += now(device) - waited  # not counted in the elapsed seconds
            per_step.append(
                {
                    "allocator": counter_increase(counts, after),
                    "wall_seconds": wall,
                    "elapsed_seconds": elapsed,
                    "measured_seconds": None if stats is None else stats.step_seconds,
                    "forward_seconds": None if stats is None else stats.forward_seconds,
                    "backward_seconds": None if stats is None else stats.backward_seconds,
                    "predicted_seconds": None if stats is None else stats.predicted_step_seconds,
                    "planning_seconds": None if stats is None else stats.planning_seconds,
                    "background_planning_seconds": (
                        None if stats is None else stats.background_planning_seconds
                    ),
                    "peak_bytes": None if stats is None else stats.peak_device_bytes,
                    "predicted_peak_bytes": None if stats is None else stats.predicted_peak_bytes,
                    "source": None if stats is None or stats.plan_source is None else stats.plan_source.value,
                }
            )
        plan = session.plan
        measured_ratio = None if session.stats is None else session.stats.recompute_cost_ratio
        if device.type == "cuda" and steps > 0:  # one more step, after the figures above
            try:
                streams = {**profile_streams(profiled_step), "step": profiled}
            except Exception as error:  # recorded: the steps' figures still count
                streams_error = f"{type(error).__name__}: {error}"[:500]
    finally:
        session.close()
    steady = per_step[warmup:]
    result: dict[str, Any] = {
        "steps": per_step,
        "median_wall_seconds": median([step["wall_seconds"] for step in steady]),
        "median_measured_seconds": median([step["measured_seconds"] or 0.0 for step in steady]),
        "budget_bytes": budget,
        "streams": streams,
        "streams_error": streams_error,
    }
    if plan is not None:
        profile = plan.profile
        result.update(
            budget_bytes=plan.budget_bytes,
            static_bytes=profile.static_bytes,
            saved_bytes=sum(layer.saved_bytes for layer in profile.layers),
            profiled_forward_seconds=sum(layer.forward_seconds for layer in profile.layers),
            profiled_backward_seconds=sum(layer.backward_seconds for layer in profile.layers),
            unconstrained_seconds=plan.unconstrained_seconds,
            predicted_step_seconds=plan.predicted_step_seconds,
            predicted_peak_bytes=per_step[-1]["predicted_peak_bytes"] or plan.predicted_peak_bytes,
            recomputed_segments=len(plan.recomputed),
            recompute_seconds=plan.recompute_seconds,
            recompute_cost_ratio=profile.recompute_cost_ratio,
            measured_recompute_cost_ratio=measured_ratio,
            swapped_bytes=plan.swapped_bytes,
            working_memory=working_memory(profile),
            layers=len(profile.layers),
            plan=plan.to_dict(),
            profile=dataclasses.asdict(profile),  # every figure planned from: re-plan it offline
        )
    return result


def working_memory(profile: StepProfile) -> dict[str, Any]:
    """The largest working memory the session measured at a forward and at a backward level,
    with their layers, and between passes (all 0 where it measures none: on CPU without an
    allocator).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> layers = (LayerProfile("a", 8, 8, forward_working_bytes=5), LayerProfile("b", 8, 8))
        >>> working_memory(StepProfile(layers, 0, outside_working_bytes=3))["forward"]
        ['a', 5]
    """
    forward = max(profile.layers, key=lambda layer: layer.forward_working_bytes, default=None)
    backward = max(profile.layers, key=lambda layer: layer.backward_working_bytes, default=None)
    return {
        "forward": None if forward is None else [forward.name, forward.forward_working_bytes],
        "backward": None if backward is None else [backward.name, backward.backward_working_bytes],
        "outside": profile.outside_working_bytes,
    }


def _working_memory_line(name: str, run: dict[str, Any]) -> list[str]:
    working = run.get("working_memory")
    if not working or working["forward"] is None:
        return []
    (forward_layer, forward), (backward_layer, backward) = working["forward"], working["backward"]
    return [
        f"- {name}: working memory measured beyond the plan's levels: at most {fmt_bytes(forward)} "
        f"in forward (`{forward_layer}`), {fmt_bytes(backward)} in backward (`{backward_layer}`), "
        f"{fmt_bytes(working['outside'])} between passes"
    ]


def markdown(record: dict[str, Any]) -> str:
    """The three runs side by side."""
    plain, kept, part = record["plain"], record["kept"], record["fraction"]
    busy = plain.get("gpu_busy_seconds")
    lines = [
        f"# Time model calibration: {record['workload']} {record['params']} on {record['device']}",
        "",
        "Sessions make refining plans "
        + ("on planning threads" if record.get("plan_in_background", True) else "inline (`--plan-inline`)")
        + f"; the session at the fraction's budget plans under policy `{record.get('policy', 'auto')}`.",
        "",
        f"- plain step (median): {fmt_ms(plain['median_step_seconds'])} ms"
        + (
            f"; in one profiled step ({fmt_ms(plain['profiled_step_seconds'])} ms) the GPU ran "
            f"{plain['kernels']} kernels, busy {fmt_ms(busy)} ms"
            if busy is not None
            else ""
        ),
        "",
        *_blocks_line(plain.get("blocks")),
        "| run | budget | profiled fwd+bwd compute ms | unconstrained ms (model) | predicted step ms "
        "| measured steady step ms (wall) | recomputed (ms added, cost ratio planned; measured) | swapped "
        "| predicted peak | measured peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in (("kept", kept), (f"static + {record['fraction_text']} act", part)):
        last = run["steps"][-1] if run["steps"] else {}
        compute = run.get("profiled_forward_seconds", 0.0) + run.get("profiled_backward_seconds", 0.0)
        if "error" in run:
            lines.append(f"| {name} | {run['budget_bytes']} | {run['error'][:300]} |||||||")
            continue
        lines.append(
            f"| {name} | {fmt_bytes(run.get('budget_bytes'))} | {fmt_ms(compute)} "
            f"| {fmt_ms(run.get('unconstrained_seconds'))} | {fmt_ms(run.get('predicted_step_seconds'))} "
            f"| {fmt_ms(run['median_wall_seconds'])} | {_recomputed_cell(run)} "
            f"| {fmt_bytes(run.get('swapped_bytes'))} | {fmt_bytes(run.get('predicted_peak_bytes'))} "
            f"| {fmt_bytes(last.get('peak_bytes'))} |"
        )
    working_lines = [
        line for name, run in (("kept", kept), ("fraction", part)) for line in _working_memory_line(name, run)
    ]
    if working_lines:
        lines += ["", *working_lines]
    runs = (("plain", plain), ("kept", kept), ("fraction", part))
    where = [line for name, run in runs for line in where_line(name, run.get("streams"))]
    if where:
        lines += [
            "",
            "Where the time went: one more step under `torch.profiler` (the device's activity alone; "
            "its optimizer step included), after each run's other figures:",
            "",
            *where,
        ]
    lines += [
        "",
        "Per step (wall ms, measured ms (its forward + backward), predicted ms, plan source, host ms "
        "planning the next passes within the wall time, ms a planning thread took making the plan this "
        "step adopted; on CUDA the allocator's retries under the cap, cudaMalloc and cudaFree calls). "
        "A step timed layer by layer measures its own forward and backward less its waits on copies; "
        "a replayed one, the latest step the device finished, whole:",
        "",
    ]
    for name, run in (("kept", kept), ("fraction", part)):
        cells = [
            f"{fmt_ms(step['wall_seconds'])}/{fmt_ms(step['measured_seconds'])}{_split_cell(step)}/"
            f"{fmt_ms(step['predicted_seconds'])}/{step['source']}/{fmt_ms(step.get('planning_seconds'))}/"
            f"{fmt_ms(step.get('background_planning_seconds'))}" + _allocator_cell(step["allocator"])
            for step in run["steps"]
        ]
        lines.append(f"- {name}: " + ", ".join(cells))
    lines += [
        "",
        "Seconds from the first step's start to the end of each step (its optimizer step included; "
        "the wait for plans at the end of the warm-up not):",
        "",
    ]
    for name, run in (("kept", kept), ("fraction", part)):
        marks = [step.get("elapsed_seconds") for step in run["steps"]]
        lines.append(f"- {name}: " + ", ".join("-" if mark is None else f"{mark:.3f}" for mark in marks))
    return "\n".join(lines) + "\n"


def _blocks_line(blocks: list[dict[str, Any]] | None) -> list[str]:
    if not blocks:
        return []
    host = sum(block["host_seconds"] for block in blocks)
    device = sum(block["device_seconds"] for block in blocks)
    slower = sum(block["host_seconds"] > block["device_seconds"] for block in blocks)
    return [
        f"- forward of its {len(blocks)} blocks (what full checkpointing recomputes), one step under the "
        f"profiler: host {fmt_ms(host)} ms, device {fmt_ms(device)} ms; {slower} blocks take the host "
        "longer to issue than the device to run",
        "",
    ]


def _recomputed_cell(run: dict[str, Any]) -> str:
    """Segments recomputed, with the milliseconds the plan adds to backward for them and the
    recomputation cost ratio it planned with (what a recomputation measured, over the forward it
    repeats), then the ratio the session measured last where it differs."""
    count = run.get("recomputed_segments")
    if not count or "recompute_seconds" not in run:
        return str(count)
    planned = run["recompute_cost_ratio"]
    measured = run.get("measured_recompute_cost_ratio")
    since = "" if measured is None or measured == planned else f"; measured {measured:.2f}x"
    return f"{count} ({fmt_ms(run['recompute_seconds'])} ms, {planned:.2f}x{since})"


def _split_cell(step: dict[str, Any]) -> str:
    """`` (forward + backward)`` ms of a step, where its record holds them."""
    forward, backward = step.get("forward_seconds"), step.get("backward_seconds")
    if forward is None or backward is None:
        return ""
    return f" ({fmt_ms(forward)} + {fmt_ms(backward)})"


def _allocator_cell(counts: dict[str, int]) -> str:
    if not counts:
        return ""
    return f" (r{counts['num_alloc_retries']} m{counts['num_device_alloc']} f{counts['num_device_free']})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.calibration", description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--fraction", default="1/2", help="of the saved activations, on top of the model state"
    )
    parser.add_argument(
        "--plan-inline",
        action="store_true",
        help="sessions plan at the end of the pass their figures come from (plan_in_background=False)",
    )
    parser.add_argument(
        "--policy",
        default="auto",
        choices=POLICIES,
        help="what the session at the fraction's budget may do besides keeping (OffloadConfig.policy)",
    )
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    workload = workload_from_args(args)
    device = resolve_device(args.device)
    fraction = parse_fraction(args.fraction)
    plain = plain_run(workload, device, args.warmup, args.steps)
    background = not args.plan_inline
    kept = session_run(workload, device, "auto", args.warmup, args.steps, background)
    if "static_bytes" not in kept:
        raise SystemExit(
            f"bench.calibration: the session that keeps everything made no plan: {kept.get('error')}"
        )
    budget = kept["static_bytes"] + int(fraction * kept["saved_bytes"])
    part = session_run(workload, device, budget, args.warmup, args.steps, background, args.policy)
    record = {
        "kind": "calibration",
        "workload": workload.name,
        "params": workload.params,
        "device": str(device),
        "fraction_text": args.fraction,
        "plan_in_background": background,
        "policy": args.policy,
        "plain": plain,
        "kept": kept,
        "fraction": part,
    }
    text = markdown(record)
    name = f"calibration-{workload.name}" + ("" if args.policy == "auto" else f"-{args.policy}")
    write_result(args.results_dir, device, name, record, text)
    print(text)
    return record


if __name__ == "__main__":
    main()
