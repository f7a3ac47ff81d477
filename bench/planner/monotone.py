"""``python -m bench.planner.monotone``: how often the planner predicts a slower step at a larger
budget than at a smaller one, over drawn steps, this checkout against another.

    python -m bench.planner.monotone --baseline /path/to/checkout   # 160 steps, 25 budgets each
    python -m bench.planner.monotone --steps 2 --budgets 4          # seconds: checks that it runs

Draws steps shaped as the planner's property tests draw them (:func:`draw_step`: a stem, two or
three stages of three or four blocks of two layers, a head; each stage and block a segment that
may be recomputed, some blocks' selective recomputation measured; the link at one of four
rates), enough of them that the search is heuristic (more candidates than every subset allows).
Each is planned under ``auto`` at budgets spread evenly from its smallest budget to its
unconstrained peak, in a fresh process per checkout (:mod:`.budget_sweep`, the baseline's first).

A budget counts as *slower than a smaller one* when its plan's predicted step is above the
fastest predicted at any smaller budget of the same step (any plan that fits a budget fits
every larger one, so a search that found it there could have found it here). Also reported, per
side: the worst such excess, the sum of the predicted steps over the budgets every side planned
(a lower sum: faster plans), and the CPU seconds of planning.

Writes ``<results-dir>/cpu/<date>-<name>.json`` and ``.md``. Predictions on made-up steps, not
measurements of any GPU.
"""

from __future__ import annotations

import argparse
import pickle
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT, git_commit, git_state
from bench.planner.checkouts import run_script
from bench.report import write_result
from lightning_accudnn.planner.plan import min_budget_bytes
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

__all__ = ["draw_step", "main", "markdown", "slower_than_smaller", "summarise"]

_CHILD = Path(__file__).resolve().parent / "budget_sweep.py"


def draw_step(rng: random.Random) -> StepProfile:
    """A step of two or three stages of three or four two-layer blocks (each stage and each
    block a segment; some blocks with their selective recomputation measured) between a stem
    and a head, sizes and times drawn from ``rng``.

    Example:
        >>> step = draw_step(random.Random(0))
        >>> step.layers[0].name, step.layers[-1].name, len(step.segments) >= 8
        ('stem', 'head', True)
    """
    seconds = (0.5, 1.0, 2.0)
    layers = [LayerProfile("stem", rng.randint(10, 100), rng.randint(0, 10), 1.0, 2.0)]
    segments = []
    for stage in range(rng.randint(2, 3)):
        segments.append(SegmentProfile(f"s{stage}", rng.randint(1, 30)))
        for index in range(rng.randint(3, 4)):
            name = f"s{stage}.b{index}"
            block = []
            for part in ("conv", "relu"):
                saved = rng.randint(20, 120)
                swappable = saved if rng.random() < 0.5 else rng.randint(0, saved)
                block.append(
                    LayerProfile(f"{name}.{part}", saved, swappable, rng.choice(seconds), rng.choice(seconds))
                )
            layers += block
            measured = rng.random() < 0.5
            segments.append(
                SegmentProfile(
                    name,
                    rng.randint(1, 30),
                    rng.randint(0, 30),
                    selective_kept_bytes=block[0].saved_bytes if measured else None,
                    selective_recompute_share=rng.choice((0.1, 0.5, 0.9)) if measured else 1.0,
                    selective_recomputed_bytes=block[1].saved_bytes if measured else None,
                )
            )
    layers.append(LayerProfile("head", rng.randint(1, 20), 0, 0.5, 1.0))
    link = rng.choice((float("inf"), 50.0, 200.0, 1000.0))
    return StepProfile(
        tuple(layers),
        rng.randint(0, 200),
        link,
        link,
        segments=tuple(segments),
        recompute_cost_ratio=rng.choice((1.0, 0.5, 4.0)),
    )


def sweep_budgets(profile: StepProfile, count: int) -> list[int]:
    """``count + 1`` budgets spread evenly from the step's smallest budget to its unconstrained
    peak (fewer where they coincide).

    Example:
        >>> layers = tuple(LayerProfile(f"l{i}", 100, 100, 1.0, 2.0) for i in range(3))
        >>> sweep_budgets(StepProfile(layers, 0, 100.0, 100.0), 2)
        [200, 250, 300]
    """
    smallest, top = min_budget_bytes(profile), profile.unconstrained_peak_bytes
    return sorted({smallest + (top - smallest) * i // count for i in range(count + 1)})


def slower_than_smaller(steps: Sequence[float | None]) -> list[float]:
    """For each budget (in increasing order) whose predicted step is above the fastest at a
    smaller budget, by how much (its step over that fastest, less one).

    Example:
        >>> slower_than_smaller([3.0, 2.0, 2.5, 2.0, None, 1.0])
        [0.25]
    """
    excess, fastest = [], None
    for step in steps:
        if step is None:
            continue
        if fastest is not None and step > fastest * (1 + 1e-9):
            excess.append(step / fastest - 1)
        fastest = step if fastest is None else min(fastest, step)
    return excess


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per side: budgets planned, how many were slower than a smaller one (and in how many
    steps), the worst excess, the sum of predicted steps where every side planned, CPU seconds.

    Example:
        >>> run = lambda steps: [{"steps": steps, "seconds": 1.0, "searches": ["heuristic"] * 3}]
        >>> out = summarise({"baseline": run([3.0, 2.0, 2.5]), "this": run([3.0, 2.0, 2.0])})
        >>> out["baseline"]["slower_than_a_smaller"], out["this"]["slower_than_a_smaller"]
        (1, 0)
        >>> out["baseline"]["sum_of_steps"], out["this"]["sum_of_steps"]
        (7.5, 7.0)
    """
    sides = list(runs)
    summary = {}
    for side in sides:
        excess = [slower_than_smaller(swept["steps"]) for swept in runs[side]]
        common = 0.0
        for index, swept in enumerate(runs[side]):
            for budget, step in enumerate(swept["steps"]):
                if all(runs[other][index]["steps"][budget] is not None for other in sides):
                    common += step
        searches = [method for swept in runs[side] for method in swept["searches"] if method]
        summary[side] = {
            "steps": len(runs[side]),
            "budgets": sum(len(swept["steps"]) for swept in runs[side]),
            "slower_than_a_smaller": sum(len(found) for found in excess),
            "steps_with_one": sum(1 for found in excess if found),
            "worst_excess": max((value for found in excess for value in found), default=0.0),
            "sum_of_steps": common,
            "heuristic_share": searches.count("heuristic") / len(searches) if searches else 0.0,
            "cpu_seconds": sum(swept["seconds"] for swept in runs[side]),
        }
    return summary


def markdown(record: dict[str, Any]) -> str:
    """The record as markdown: identity, then one row per side."""
    lines = [
        f"# Larger budgets predicted slower, at {record['repo_commit'] or 'an unknown commit'}",
        "",
        record["label"],
        "",
        "| side | commit | steps | budgets | slower than a smaller budget | in steps | worst excess "
        "| sum of predicted steps | heuristic share | planning CPU s |",
        "|" + " --- |" * 10,
    ]
    for side, figures in record["summary"].items():
        commit = record["commits"][side] or "unknown"
        lines.append(
            f"| {side} | {commit[:7]} | {figures['steps']} | {figures['budgets']} | "
            f"{figures['slower_than_a_smaller']} | {figures['steps_with_one']} | "
            f"{100 * figures['worst_excess']:.2f} % | {figures['sum_of_steps']:.3f} | "
            f"{100 * figures['heuristic_share']:.0f} % | {figures['cpu_seconds']:.1f} |"
        )
    lines += [
        "",
        "Slower than a smaller budget: budgets whose plan's predicted step is above the fastest "
        "predicted at a smaller budget of the same step; worst excess: the most such a step is "
        "above it. Sum of predicted steps: over the budgets every side planned (lower is faster). "
        "Planning CPU s: time.process_time of all the plans, this shared machine's CPU.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m bench.planner.monotone", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=160, help="how many steps to draw")
    parser.add_argument("--budgets", type=int, default=24, help="intervals between the budgets")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout measured the same way")
    parser.add_argument("--baseline-commit", default=None, help="--baseline's commit (no checkout)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", default="planner-monotone")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.budgets < 1:
        parser.error("--steps and --budgets must be at least 1")
    rng = random.Random(args.seed)
    profiles = [draw_step(rng) for _ in range(args.steps)]
    steps = [(profile, sweep_budgets(profile, args.budgets)) for profile in profiles]
    checkouts = {"this": REPO_ROOT}
    commits = {"this": git_commit(REPO_ROOT)}
    if args.baseline is not None:
        checkouts = {"baseline": args.baseline.resolve(), **checkouts}
        commits = {"baseline": args.baseline_commit or git_commit(args.baseline.resolve()), **commits}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "steps.pkl"
        path.write_bytes(pickle.dumps(steps))
        runs = {side: run_script(checkout, _CHILD, str(path)) for side, checkout in checkouts.items()}
    record: dict[str, Any] = {
        "kind": "planner-monotone",
        "label": (
            f"{args.steps} steps drawn with seed {args.seed} (bench.planner.monotone.draw_step), each "
            f"planned under auto at {args.budgets + 1} budgets from its smallest budget to its "
            "unconstrained peak, one fresh process per checkout, on this machine's CPU. "
            "Predictions on made-up steps, not measurements."
        ),
        "repo_commit": commits["this"],
        "git": git_state(),
        "commits": commits,
        "checkouts": {side: str(checkout) for side, checkout in checkouts.items()},
        "config": {"steps": args.steps, "budgets": args.budgets, "seed": args.seed},
        "summary": summarise(runs),
    }
    text = markdown(record)
    write_result(args.results_dir, torch.device("cpu"), args.name, record, text + "\n")
    print(text)
    return record


if __name__ == "__main__":
    main()
