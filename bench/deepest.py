"""The deepest bottleneck ResNet that trains under a memory budget, by depth search.

    python -m bench.deepest --budget 12GB                      # GPU: batch 16, 224x224
    python -m bench.deepest --device cpu --budget 3MB --batch-size 2 --image-size 32 \\
        --base-width 4 --start-depth 14 --max-depth 302          # tiny CPU version (CI)

For each strategy (``accudnn``: lightning-accudnn under the budget; ``none``: no offload
under the same CUDA allocator cap, GPU only) the search doubles the number of bottleneck
blocks until a depth fails to train, then bisects between the last depth that trained and
the first that failed. A depth *trains* when its probe runs ``warmup + steps`` training
steps without an exception (out of memory, budget too small, host memory exceeded) and
its measured peak stays within the budget. Depth is ``3 * blocks + 2``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.config import RunConfig, StrategySpec
from bench.environment import REPO_ROOT, device_slug, environment, resolve_device
from bench.measure import PEAK_RSS
from bench.report import fmt_bytes, fmt_ms, matplotlib_or_reason, output_stem, raw_log, write_json
from bench.runner import run_strategy
from bench.workloads import blocks_for_depth, deep_resnet
from lightning_accudnn.planner import Budget


@dataclass
class SearchOutcome:
    """What a depth search found: the deepest block count that trained, the first that did
    not (``None`` if ``max_blocks`` trained), and every probe in the order run."""

    deepest_blocks: int | None
    first_failing_blocks: int | None
    probes: list[tuple[int, bool]] = field(default_factory=list)
    reached_max: bool = False


def search_depth(
    trains: Callable[[int], bool], start_blocks: int, max_blocks: int, resolution: int = 1
) -> SearchOutcome:
    """Exponential then binary search for the largest block count for which ``trains`` holds.

    Assumes a model that does not train at ``n`` blocks does not train deeper. Stops the
    bisection once the bracket is ``resolution`` blocks wide.

    Example:
        >>> outcome = search_depth(lambda blocks: blocks <= 37, start_blocks=4, max_blocks=1000)
        >>> outcome.deepest_blocks, outcome.first_failing_blocks, len(outcome.probes)
        (37, 38, 10)
        >>> search_depth(lambda blocks: True, 4, 20).reached_max
        True
    """
    if start_blocks < 4 or max_blocks < start_blocks or resolution < 1:
        raise ValueError("need 4 <= start_blocks <= max_blocks and resolution >= 1")
    outcome = SearchOutcome(None, None)

    def probe(blocks: int) -> bool:
        ok = trains(blocks)
        outcome.probes.append((blocks, ok))
        return ok

    blocks = start_blocks
    while True:
        if not probe(blocks):
            outcome.first_failing_blocks = blocks
            break
        outcome.deepest_blocks = blocks
        if blocks >= max_blocks:
            outcome.reached_max = True
            return outcome
        blocks = min(2 * blocks, max_blocks)
    low = outcome.deepest_blocks
    if low is None:
        if blocks == 4:
            return outcome
        low = 3  # nothing trained at start_blocks: bisect down to the smallest model (4 blocks)
    high = outcome.first_failing_blocks
    assert high is not None
    while high - low > resolution:
        middle = (low + high) // 2
        if middle < 4:
            break
        if probe(middle):
            low = outcome.deepest_blocks = middle
        else:
            high = outcome.first_failing_blocks = middle
    return outcome


def probe_row(
    blocks: int, strategy: str, budget_bytes: int, config: RunConfig, sizes: dict[str, Any]
) -> dict[str, Any]:
    """Train a ``3 * blocks + 2``-layer ResNet under ``strategy`` and the budget; its row.

    ``trains`` is added to the row: ok status and a peak within the budget (where the peak
    is device bytes: the CUDA allocator or the engine's ledger).
    """
    workload = deep_resnet(depth=3 * blocks + 2, **sizes)
    kind = "accudnn" if strategy == "accudnn" else "capped"
    spec = StrategySpec(f"{strategy}-d{3 * blocks + 2}", kind, {"budget_bytes": budget_bytes})
    started = time.time()
    row = run_strategy(workload, spec, config).row.as_dict()
    row["depth"], row["blocks"] = 3 * blocks + 2, blocks
    peak = row.get("peak_allocated_bytes")
    within = peak is not None and (row["peak_source"] == PEAK_RSS or peak <= budget_bytes)
    row["trains"] = row["status"] == "ok" and within
    if row["status"] == "ok" and not within:
        row["notes"].append(f"peak {fmt_bytes(peak)} over the budget {fmt_bytes(budget_bytes)}")
    print(
        f"bench.deepest: {strategy} depth {row['depth']}: {'trains' if row['trains'] else 'does not train'}"
        + (f" ({row['error_type']}: {row['error']})" if row.get("error") else "")
        + f" [{time.time() - started:.1f} s]",
        flush=True,
    )
    return row


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.deepest", description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="12GB", help='memory budget, e.g. "12GB" (default), "8GiB"')
    parser.add_argument("--device", default="auto")
    parser.add_argument("--strategies", default="accudnn,none", help="accudnn and/or none (none: GPU only)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--base-width", type=int, default=64)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--start-depth", type=int, default=152, help="first depth probed (3 * blocks + 2)")
    parser.add_argument("--max-depth", type=int, default=30002, help="deepest depth probed")
    parser.add_argument("--resolution", type=int, default=1, help="stop bisecting at this many blocks")
    parser.add_argument("--warmup", type=int, default=2, help="steps before the measured one(s) (default 2)")
    parser.add_argument("--steps", type=int, default=1, help="measured steps per probe (default 1)")
    parser.add_argument("--min-swap-bytes", type=int)
    parser.add_argument("--reserve-bytes", type=int)
    parser.add_argument("--host-memory-limit")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument(
        "--name", default=None, help="file name after the date (default deepest-resnet-<budget>)"
    )
    parser.add_argument("--no-plot", action="store_true")
    return parser


def _plot(path: Path, results: dict[str, Any], title: str) -> dict[str, Any]:
    plt, reason = matplotlib_or_reason()
    if plt is None:
        return {"written": False, "reason": reason}
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for strategy, result in results.items():
        probes = result["probes"]
        for trains, marker in ((True, "o"), (False, "x")):
            points = [
                (p["depth"], (p.get("peak_allocated_bytes") or 0) / 1e9)
                for p in probes
                if p["trains"] is trains
            ]
            if points:
                axis.scatter(
                    *zip(*points, strict=True),
                    marker=marker,
                    label=f"{strategy} {'trains' if trains else 'fails'}",
                )
    axis.set_xscale("log")
    axis.set_xlabel("depth (layers)")
    axis.set_ylabel("measured peak (GB)")
    axis.legend(fontsize=8)
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return {"written": True, "path": path.name}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Search every selected strategy; write and return the result."""
    device = resolve_device(args.device)
    budget_spec = Budget.parse(int(args.budget) if args.budget.isdigit() else args.budget)
    if budget_spec.kind != "bytes":
        raise SystemExit(f"--budget takes a size (bytes, GB, GiB...), got {args.budget!r}")
    budget_bytes = int(budget_spec.value)
    start_blocks, max_blocks = blocks_for_depth(args.start_depth), blocks_for_depth(args.max_depth)
    sizes = {
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "base_width": args.base_width,
        "precision": args.precision,
    }
    config = RunConfig(
        device=device,
        warmup=args.warmup,
        steps=args.steps,
        min_swap_bytes=args.min_swap_bytes,
        reserve_bytes=args.reserve_bytes,
        host_memory_limit=args.host_memory_limit,
    )
    name = args.name or f"deepest-resnet-{args.budget}"
    stem = output_stem(args.results_dir, device_slug(device), name)
    started = time.time()
    with raw_log(stem.with_suffix(".log")):
        env = environment(device)
        print(
            f"bench.deepest: budget {fmt_bytes(budget_bytes)} on {env['device']}, {sizes}; writing {stem}.*"
        )
        results: dict[str, Any] = {}
        for strategy in [s.strip() for s in args.strategies.split(",") if s.strip()]:
            if strategy not in ("accudnn", "none"):
                raise SystemExit(f"unknown strategy {strategy!r}: accudnn or none")
            if strategy == "none" and device.type != "cuda":
                results[strategy] = {"status": "skipped", "reason": "no allocator cap on CPU", "probes": []}
                continue
            rows: list[dict[str, Any]] = []

            def trains(blocks: int, strategy: str = strategy, rows: list[dict[str, Any]] = rows) -> bool:
                rows.append(probe_row(blocks, strategy, budget_bytes, config, sizes))
                return rows[-1]["trains"]

            outcome = search_depth(trains, start_blocks, max_blocks, args.resolution)
            deepest = outcome.deepest_blocks
            results[strategy] = {
                "status": "ok",
                "deepest_depth": None if deepest is None else 3 * deepest + 2,
                "deepest_blocks": deepest,
                "first_failing_depth": None
                if outcome.first_failing_blocks is None
                else 3 * outcome.first_failing_blocks + 2,
                "reached_max_depth": outcome.reached_max,
                "probes": rows,
            }
        data: dict[str, Any] = {
            "kind": "bench.deepest",
            "schema": 1,
            "label": "CPU run of the search (tiny sizes): not GPU evidence" if device.type == "cpu" else None,
            "budget_bytes": budget_bytes,
            "budget": args.budget,
            "sizes": sizes,
            "search": {
                "start_depth": args.start_depth,
                "max_depth": args.max_depth,
                "resolution_blocks": args.resolution,
                "warmup": args.warmup,
                "steps": args.steps,
            },
            "environment": env,
            "results": results,
            "files": {"json": stem.name + ".json", "markdown": stem.name + ".md", "log": stem.name + ".log"},
        }
        data["plot"] = (
            {"written": False, "reason": "--no-plot"}
            if args.no_plot
            else _plot(
                stem.with_suffix(".png"), results, f"deepest ResNet under {args.budget} on {env['device']}"
            )
        )
        data["files"]["png"] = data["plot"].get("path")
        data["wall_seconds"] = time.time() - started
        markdown = _markdown(data)
        stem.with_suffix(".md").write_text(markdown, encoding="utf-8")
        write_json(stem.with_suffix(".json"), data)
        print(markdown)
    return data


def _markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        f"# Deepest bottleneck ResNet under {data['budget']} on {env['device']} ({env['date_utc'][:10]})",
        "",
    ]
    if data["label"]:
        lines += [f"**{data['label']}**", ""]
    lines += [
        f"- device: {env['device']}; torch {env['torch']}, CUDA {env['cuda']}, driver {env['driver']}",
        f"- commit: {env['git']['commit']}{' (working tree differs)' if env['git']['dirty'] else ''}",
        f"- sizes: {data['sizes']}; search: {data['search']}",
        "",
        "| strategy | deepest depth that trained | first depth that failed | reached max |",
        "|---|---|---|---|",
    ]
    for strategy, result in data["results"].items():
        if result["status"] != "ok":
            lines.append(f"| {strategy} | {result['status']}: {result['reason']} | - | - |")
            continue
        lines.append(
            f"| {strategy} | {result['deepest_depth'] or '-'} | {result['first_failing_depth'] or '-'} "
            f"| {result['reached_max_depth']} |"
        )
    lines += [
        "",
        "| strategy | depth | trains | peak | peak source | step ms | swapped out/step | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for strategy, result in data["results"].items():
        for probe in result["probes"]:
            error = (probe.get("error") or "").replace("|", "/")[:90]
            lines.append(
                f"| {strategy} | {probe['depth']} | {probe['trains']} "
                f"| {fmt_bytes(probe.get('peak_allocated_bytes'))} "
                f"| {probe.get('peak_source') or '-'} | {fmt_ms(probe.get('median_step_seconds'))} "
                f"| {fmt_bytes(probe.get('bytes_swapped_out'))} | {error} |"
            )
    plot = data["plot"]
    lines += [
        "",
        f"Plot: {plot['path'] if plot['written'] else plot['reason']}. Raw log: {data['files']['log']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m bench.deepest``; returns the result written."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
