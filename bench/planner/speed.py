"""``python -m bench.planner.speed``: how long ``accudnn plan`` takes, and where the time goes.

    python -m bench.planner.speed                          # ResNet-152 and GPT-2 medium, 3 runs each
    python -m bench.planner.speed --repo /path/to/checkout --name planner-speed-before

Each run is a fresh process, as a user's command is: ``python -m lightning_accudnn plan`` with
the case's arguments and the budget of a half of its activations (static bytes + 1/2 x saved
bytes), timed from outside (wall clock, and the child's CPU time: the machine may be shared);
then, in the same rounds, the case's import floor, timed from outside the same way
(:mod:`bench.planner.import_floor`): a fresh process that imports only torch and the model's
library (torchvision, transformers) as the CLI finds it, the least any CLI can take for that
case on this machine; then, in another fresh process, the CLI's work split into phases timed
from inside (:mod:`bench.planner.phases`): importing the CLI, the first ``FakeTensorMode`` (it
imports ``torch._dynamo``), the model's library, the trace, the profile and the plan.
``--repo`` times the CLI of another checkout (the import floor and the phases always run this
one's code, with this interpreter). Writes ``<results-dir>/cpu/<date>-<name>.json`` and ``.md``;
the figures are this CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT, git_commit
from bench.planner.cases import CASES, Case
from bench.planner.phases import PHASES
from bench.report import write_result

__all__ = ["main"]

SPEED_CASES = ("resnet152-bf16", "gpt2-medium-bf16")
_MODELS_DIR = Path(__file__).resolve().parent  # bench/planner: its models.py as module ``models``


def _portable(case: Case) -> Case:
    """The case with this repository's factories importable from any checkout (``models:...``)."""
    prefix = "bench.planner.models:"
    if case.model.startswith(prefix):
        return Case(**{**case.__dict__, "model": "models:" + case.model.removeprefix(prefix)})
    return case


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(_MODELS_DIR)}


def _timed(command: list[str], cwd: Path) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=_child_env(), capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, cpu, done.stdout


def _half_budget(case: Case, gpu_name: str) -> int:
    from bench.planner.cases import trace_case
    from lightning_accudnn.profiling.gpus import get_gpu

    profile = trace_case(case, get_gpu(gpu_name)).profile
    return profile.static_bytes + round(profile.saved_bytes / 2)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def measure_case(key: str, gpu: str, runs: int, repo: Path, baseline: Path | None) -> dict[str, Any]:
    """``runs`` interleaved rounds: the baseline's CLI (if any), this CLI, the import floor, then
    the phases."""
    case = CASES[key]
    budget = _half_budget(case, gpu)
    portable = _portable(case)
    command = [sys.executable, "-m", "lightning_accudnn", *portable.command(gpu, str(budget)), "--json"]
    floor = [sys.executable, "-m", "bench.planner.import_floor", portable.model]
    times: dict[str, list[float]] = {
        name: [] for name in ("wall", "cpu", "baseline_wall", "baseline_cpu", "floor_wall", "floor_cpu")
    }
    laps: dict[str, dict[str, list[float]]] = {
        clock: {name: [] for name in PHASES} for clock in ("wall", "cpu")
    }
    for _ in range(runs):
        if baseline is not None:
            wall, cpu, _ = _timed(command, baseline)
            times["baseline_wall"].append(wall)
            times["baseline_cpu"].append(cpu)
        wall, cpu, _ = _timed(command, repo)
        times["wall"].append(wall)
        times["cpu"].append(cpu)
        wall, cpu, _ = _timed(floor, REPO_ROOT)
        times["floor_wall"].append(wall)
        times["floor_cpu"].append(cpu)
        _, _, out = _timed([sys.executable, "-m", "bench.planner.phases", key, str(budget), gpu], REPO_ROOT)
        for clock, seconds in json.loads(out.strip().splitlines()[-1]).items():
            for name, value in seconds.items():
                laps[clock][name].append(value)
    record: dict[str, Any] = {
        "case": key,
        "title": case.title,
        "budget_bytes": budget,
        "command": command[1:],
        "cli_wall_seconds": _summary(times["wall"]),
        "cli_cpu_seconds": _summary(times["cpu"]),
        "import_floor_command": floor[1:],
        "import_floor_wall_seconds": _summary(times["floor_wall"]),
        "import_floor_cpu_seconds": _summary(times["floor_cpu"]),
        "phase_wall_seconds": {name: _summary(values) for name, values in laps["wall"].items()},
        "phase_cpu_seconds": {name: _summary(values) for name, values in laps["cpu"].items()},
    }
    if baseline is not None:
        record["baseline_cli_wall_seconds"] = _summary(times["baseline_wall"])
        record["baseline_cli_cpu_seconds"] = _summary(times["baseline_cpu"])
    return record


def _spread(summary: dict[str, float]) -> str:
    return f"{summary['median']:.2f} [{summary['min']:.2f}, {summary['max']:.2f}]"


def markdown(record: dict[str, Any]) -> str:
    title = f"# `accudnn plan` time at {record['repo_commit'] or 'an unknown commit'}"
    lines = [title, "", record["label"], ""]
    with_baseline = record["baseline_commit"] is not None
    before = "baseline CLI wall s | baseline CLI CPU s | " if with_baseline else ""
    lines += [
        f"| case | {before}CLI wall s | CLI CPU s | import floor wall s | import floor CPU s | "
        + " | ".join(f"{name} CPU (wall)" for name in PHASES)
        + " |",
        "|" + " --- |" * (5 + 2 * with_baseline + len(PHASES)),
    ]
    for case in record["cases"]:
        base = ""
        if with_baseline:
            wall, cpu = case["baseline_cli_wall_seconds"], case["baseline_cli_cpu_seconds"]
            base = f"{_spread(wall)} | {_spread(cpu)} | "
        cpu_laps, wall_laps = case["phase_cpu_seconds"], case["phase_wall_seconds"]
        phase = " | ".join(
            f"{cpu_laps[name]['median']:.2f} ({wall_laps[name]['median']:.2f})" for name in PHASES
        )
        lines.append(
            f"| {case['title']} | {base}{_spread(case['cli_wall_seconds'])} | "
            f"{_spread(case['cli_cpu_seconds'])} | {_spread(case['import_floor_wall_seconds'])} | "
            f"{_spread(case['import_floor_cpu_seconds'])} | {phase} |"
        )
    lines += [
        "",
        "Seconds: median [lowest, highest] over the runs; phases: medians, CPU (wall). "
        "Import floor: a fresh process that imports torch and the model's library only (the least "
        "any CLI can take for that case on this machine: the interpreter, torch and the model's "
        "library).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    description = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.planner.speed", description=description)
    parser.add_argument("--cases", default=",".join(SPEED_CASES), help=f"of: {', '.join(CASES)}")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout whose CLI is timed")
    parser.add_argument("--commit", default=None, help="the commit of --repo, when it is no git checkout")
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout timed in the same rounds")
    parser.add_argument("--baseline-commit", default=None, help="--baseline's commit (no checkout)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", default="planner-speed")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    commit = args.commit or git_commit(repo)
    keys = [key.strip() for key in args.cases.split(",") if key.strip()]
    baseline = args.baseline.resolve() if args.baseline is not None else None
    baseline_commit = None
    if baseline is not None:
        baseline_commit = args.baseline_commit or git_commit(baseline) or "unknown"
    cases = [measure_case(key, args.gpu, args.runs, repo, baseline) for key in keys]
    record = {
        "kind": "planner-speed",
        "label": (
            f"Wall-clock and CPU seconds of `python -m lightning_accudnn plan ... --gpu {args.gpu}` at "
            f"the budget of half the activations, on this machine's CPU (shared: CPU seconds vary less), "
            f"{args.runs} fresh processes per case; the CLI of {repo} at commit {commit}. In the same "
            "rounds, the import floor: a fresh process of this checkout that imports only torch and "
            "the model's library as the CLI finds it (torchvision.models; the factory's module and "
            "the imports in its body), the least any CLI can take for that case on this machine; "
            "phases timed with this checkout's code."
            + (f" Baseline: the CLI of {baseline} at {baseline_commit}, same rounds." if baseline else "")
        ),
        "repo": str(repo),
        "repo_commit": commit,
        "baseline": str(baseline) if baseline is not None else None,
        "baseline_commit": baseline_commit,
        "cases": cases,
    }
    text = markdown(record)
    write_result(args.results_dir, torch.device("cpu"), args.name, record, text + "\n")
    print(text)
    return record


if __name__ == "__main__":
    main()
