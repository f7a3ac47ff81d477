"""``python -m bench.planner.plan_time``: CPU seconds of planning each cell of the planner table,
this checkout against another, and whether the two make the same plans.

    python -m bench.planner.plan_time --baseline /path/to/checkout   # the table's models, 3 rounds
    python -m bench.planner.plan_time --cases tiny --rounds 1        # seconds: checks that it runs

Traces each case once with this checkout (as ``accudnn plan`` traces it, :mod:`.cases`) and
pickles the profiles (so the baseline must read this checkout's profile types); then, round after
round, one fresh process per checkout, the baseline's first, in the same order every round,
plans every cell (:mod:`.timed_plans`: each budget fraction of the table under each planner
policy, on a fresh copy of the profile, as each pass's profile is another object). Each process
first imports torch, torchvision and transformers (``--no-heap`` leaves them out): planning runs
in such a process (``accudnn plan``, a training run), and the garbage collector's full
collections, which a plan's allocations trigger, walk all of that heap.

Writes ``<results-dir>/cpu/<date>-<name>.json`` and ``.md``: per cell the CPU seconds
(``time.process_time``; the machine may be shared) of each round, and whether the plans (hashes
of ``Plan.to_dict()``, or the smallest budget of a refusal) are the same in every round and
checkout; per case and policy the sum over the fractions of each cell's median.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT, git_commit
from bench.planner.cases import CASES, TABLE_CASES, trace_case
from bench.planner.checkouts import run_script
from bench.planner.timed_plans import POLICIES
from bench.report import write_result
from lightning_accudnn.profiling.gpus import get_gpu

__all__ = ["main", "markdown", "summarise"]

_CHILD = Path(__file__).resolve().parent / "timed_plans.py"


def _run_child(checkout: Path, profiles: Path, heap: bool) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = run_script(
        checkout, _CHILD, str(profiles), *(["--heap"] if heap else [])
    )
    return result


def summarise(runs: dict[str, list[dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Per cell: each side's seconds per round and median, and whether every plan is the same;
    per case and policy, and in all, each side's sum of the cells' medians.

    Example:
        >>> cell = lambda s, h: {"toy 1/2 auto": {"seconds": s, "plan": h}}
        >>> out = summarise({"baseline": [cell(2.0, "x"), cell(4.0, "x")], "this": [cell(1.0, "x")]})
        >>> out["cells"][0]["median_seconds"], out["cells"][0]["same_plan"], out["totals"]
        ({'baseline': 3.0, 'this': 1.0}, True, {'baseline': 3.0, 'this': 1.0})
        >>> out["full_collections"]
        {'toy auto': {'baseline': 0, 'this': 0}}
    """
    sides = list(runs)
    cells: list[dict[str, Any]] = []
    for name in runs[sides[0]][0]:
        seconds = {side: [run[name]["seconds"] for run in runs[side]] for side in sides}
        plans = {run[name]["plan"] for side in sides for run in runs[side]}
        full = {side: [run[name].get("full_collections", 0) for run in runs[side]] for side in sides}
        cells.append(
            {
                "cell": name,
                "seconds": seconds,
                "median_seconds": {side: statistics.median(values) for side, values in seconds.items()},
                "full_collections": full,
                "same_plan": len(plans) == 1,
            }
        )
    groups: dict[str, dict[str, float]] = {}
    collections: dict[str, dict[str, int]] = {}
    for cell in cells:
        case, _, policy = cell["cell"].split(" ")
        group = groups.setdefault(f"{case} {policy}", dict.fromkeys(sides, 0.0))
        walks = collections.setdefault(f"{case} {policy}", dict.fromkeys(sides, 0))
        for side in sides:
            group[side] += cell["median_seconds"][side]
            walks[side] += sum(cell["full_collections"][side])
    totals = {side: sum(cell["median_seconds"][side] for cell in cells) for side in sides}
    return {"cells": cells, "groups": groups, "full_collections": collections, "totals": totals}


def markdown(record: dict[str, Any]) -> str:
    """The record as markdown: identity, then seconds per case and policy."""
    summary = record["summary"]
    sides = list(summary["totals"])
    same = sum(cell["same_plan"] for cell in summary["cells"])
    lines = [
        f"# Planning CPU seconds at {record['repo_commit'] or 'an unknown commit'}",
        "",
        record["label"],
        "",
    ]
    lines += [
        f"Plans identical in every round{' and checkout' if len(sides) > 1 else ''}: "
        f"{same} of {len(summary['cells'])} cells.",
        "",
        "| case | policy | "
        + " | ".join(f"{side} s" for side in sides)
        + (" | ratio" if len(sides) > 1 else "")
        + " | full collections ("
        + ", ".join(sides)
        + ") |",
        "|" + " --- |" * (3 + len(sides) + (len(sides) > 1)),
    ]

    def row(first: str, second: str, figures: dict[str, float], walks: dict[str, int]) -> str:
        text = f"| {first} | {second} | " + " | ".join(f"{figures[side]:.2f}" for side in sides)
        if len(sides) > 1:
            base = figures[sides[0]]
            text += f" | {figures[sides[-1]] / base:.2f}x" if base > 0 else " | n/a"
        return text + " | " + ", ".join(str(walks[side]) for side in sides) + " |"

    every = dict.fromkeys(sides, 0)
    for name, figures in summary["groups"].items():
        case, policy = name.split(" ")
        walks = summary["full_collections"][name]
        lines.append(row(case, policy, figures, walks))
        every = {side: every[side] + walks[side] for side in sides}
    lines.append(row("**all**", "", summary["totals"], every))
    lines += [
        "",
        "Seconds: per case and policy, the sum over the budget fractions of each cell's median over "
        "the rounds (CPU seconds; per cell and round in the JSON). Ratio: this checkout over the "
        "baseline. Full collections: how many times the garbage collector walked the whole heap "
        "while those cells planned, over all rounds (each about 0.15 s here, in whichever cell's "
        "allocations trigger it, the same cell every round: compare sums over many cells).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.planner.plan_time", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cases", default=",".join(TABLE_CASES), help=f"of: {', '.join(CASES)}")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout timed in the same rounds")
    parser.add_argument("--baseline-commit", default=None, help="--baseline's commit (no checkout)")
    parser.add_argument(
        "--no-heap", action="store_true", help="plan without torch, torchvision, transformers"
    )
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", default="planner-plan-time")
    args = parser.parse_args(argv)
    keys = [key.strip() for key in args.cases.split(",") if key.strip()]
    gpu = get_gpu(args.gpu)
    profiles = {key: trace_case(CASES[key], gpu).profile for key in keys}
    checkouts = {"this": REPO_ROOT}
    if args.baseline is not None:
        checkouts = {"baseline": args.baseline.resolve(), **checkouts}
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {side: [] for side in checkouts}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profiles.pkl"
        path.write_bytes(pickle.dumps(profiles))
        for round_ in range(args.rounds):
            for side, checkout in checkouts.items():
                runs[side].append(_run_child(checkout, path, heap=not args.no_heap))
                print(f"round {round_ + 1}: {side} planned", flush=True)
    commit = git_commit(REPO_ROOT)
    baseline_commit = None
    if args.baseline is not None:
        baseline_commit = args.baseline_commit or git_commit(checkouts["baseline"]) or "unknown"
    heap = "without torch" if args.no_heap else "after importing torch, torchvision and transformers"
    record: dict[str, Any] = {
        "kind": "planner-plan-time",
        "label": (
            f"CPU seconds of plan_swaps per cell (policies {', '.join(POLICIES)}; budget = static bytes + "
            f"f x saved activation bytes; profiles traced for {gpu.name}), on this machine's CPU (shared), "
            f"{args.rounds} rounds, one fresh process per checkout and round ({heap}); this checkout at "
            f"{commit}"
            + (
                f", baseline {checkouts['baseline']} at {baseline_commit}, first in each round."
                if baseline_commit
                else "."
            )
        ),
        "repo_commit": commit,
        "baseline": str(checkouts.get("baseline")) if args.baseline is not None else None,
        "baseline_commit": baseline_commit,
        "cases": keys,
        "heap": not args.no_heap,
        "summary": summarise(runs),
    }
    text = markdown(record)
    write_result(args.results_dir, torch.device("cpu"), args.name, record, text + "\n")
    print(text)
    return record


if __name__ == "__main__":
    main()
