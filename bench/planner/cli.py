"""``python -m bench.planner``: the planner table, written under ``bench/results/cpu/``.

    python -m bench.planner                      # the four models of the table, a few minutes
    python -m bench.planner --cases tiny         # seconds: checks that everything runs (tests)
    python -m bench.planner --cases gpt2-medium-bf16,llama-1b-bf16 --gpu a100-80gb

Writes ``<results-dir>/cpu/<date>-planner-<gpu>.json`` and ``.md``: for each model
(:mod:`bench.planner.cases`) and budget fraction, each policy's predicted step, peak and
lower bound (:mod:`bench.planner.table`). Every figure is the CLI's model for the GPU named
(its datasheet figures), computed on this machine's CPU: a prediction, not a measurement.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT
from bench.planner.cases import CASES, TABLE_CASES, TracedCase, trace_case
from bench.planner.table import (
    DOES_NOT_FIT,
    FRACTIONS,
    NOT_AVAILABLE,
    POLICY_TITLES,
    TABLE_POLICIES,
    budget_for,
    plan_row,
)
from bench.report import fmt_bytes, write_result
from lightning_accudnn.planner.timeline import unconstrained_seconds
from lightning_accudnn.profiling.gpus import GpuSpec, get_gpu

__all__ = ["main", "markdown"]


def label(gpu: GpuSpec, commit: str | None) -> str:
    return (
        f"The planner's predictions (the model `accudnn plan --gpu` uses: {gpu.name} datasheet figures, "
        f"roofline per kernel), computed on this machine's CPU at commit {commit or 'unknown'}. "
        "Predictions, not measurements; plan_seconds and trace_seconds are this shared CPU's wall-clock "
        "times."
    )


def case_record(traced: TracedCase) -> dict[str, Any]:
    """The case's header and one row per budget fraction and policy."""
    profile = traced.profile
    rows = []
    for fraction_label, fraction in FRACTIONS:
        for policy in TABLE_POLICIES:
            rows.append(plan_row(profile, fraction_label, fraction, policy))
    case = traced.case
    return {
        "case": case.key,
        "title": case.title,
        "model": case.model,
        "batch_size": case.batch_size,
        "input_shape": list(case.input_shape),
        "dtype": case.dtype,
        "static_bytes": profile.static_bytes,
        "saved_bytes": profile.saved_bytes,
        "swappable_bytes": profile.swappable_bytes,
        "unconstrained_step_seconds": unconstrained_seconds(profile),
        "assumed_kernels": traced.kernels,
        "trace_seconds": traced.trace_seconds,
        "budgets": {name: budget_for(profile, fraction) for name, fraction in FRACTIONS},
        "rows": rows,
    }


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def _cell(row: dict[str, Any]) -> str:
    if row["status"] == NOT_AVAILABLE:
        return NOT_AVAILABLE
    bound = f"bound {_ratio(row['lower_bound_vs_unconstrained'])}"
    if row["status"] == DOES_NOT_FIT:
        return f"does not fit (needs {fmt_bytes(row['min_budget_bytes'])}); {bound}"
    peak = f"peak {fmt_bytes(row['predicted_peak_bytes'])} ({row['peak_share_of_budget'] * 100:.0f}%)"
    return f"**{_ratio(row['step_vs_unconstrained'])}**; {peak}; {bound}"


def markdown(record: dict[str, Any]) -> str:
    """The table as markdown: one section per model, rows by budget fraction, columns by policy."""
    lines = [f"# Planner table: {record['gpu']}", "", record["label"], ""]
    lines += [
        "Budget = static bytes + f x saved activation bytes (both as the trace reports them; Adam). "
        "Each cell: predicted step as a multiple of the unconstrained step (bold); predicted peak "
        "(share of the budget); the lower bound the planner reports for that budget and policy, as a "
        "multiple of the unconstrained step. Full per-block checkpointing recomputes every top-level "
        "block and keeps the rest; its bound is the recompute-only bound.",
        "",
    ]
    header = "| f | budget | " + " | ".join(POLICY_TITLES[p] for p in TABLE_POLICIES) + " |"
    for case in record["cases"]:
        kernels = "; ".join(
            f"{op}: " + ", ".join(f"{kernel} x{calls}" for kernel, calls in by_kernel.items())
            for op, by_kernel in case["assumed_kernels"].items()
        )
        lines += [
            f"## {case['title']}",
            "",
            f"static {fmt_bytes(case['static_bytes'])}, saved activations {fmt_bytes(case['saved_bytes'])}, "
            f"unconstrained step {case['unconstrained_step_seconds'] * 1e3:.1f} ms; kernels assumed: "
            f"{kernels or 'none to choose'}; traced in {case['trace_seconds']:.1f} s.",
            "",
            header,
            "|" + " --- |" * (2 + len(TABLE_POLICIES)),
        ]
        for name, _ in FRACTIONS:
            cells = {row["policy"]: _cell(row) for row in case["rows"] if row["fraction"] == name}
            budget = fmt_bytes(case["budgets"][name])
            lines.append(f"| {name} | {budget} | " + " | ".join(cells[p] for p in TABLE_POLICIES) + " |")
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=",".join(TABLE_CASES), help=f"comma-separated, of: {', '.join(CASES)}"
    )
    parser.add_argument("--gpu", default="h100", help="the GPU planned for (as accudnn plan --gpu)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", default=None, help="file name after the date (default planner-<gpu>)")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the table for the cases named; write the JSON and markdown; return the record."""
    args = build_parser().parse_args(argv)
    keys = [key.strip() for key in args.cases.split(",") if key.strip()]
    unknown = [key for key in keys if key not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    gpu = get_gpu(args.gpu)
    started = time.perf_counter()
    cases = []
    for key in keys:
        traced = trace_case(CASES[key], gpu)
        cases.append(case_record(traced))
        print(
            f"{key}: traced in {traced.trace_seconds:.1f} s, planned by {time.perf_counter() - started:.0f} s"
        )
    from bench.environment import git_state

    record: dict[str, Any] = {
        "kind": "planner-table",
        "gpu": gpu.name,
        "label": label(gpu, git_state()["commit"]),
        "fractions": [name for name, _ in FRACTIONS],
        "policies": list(TABLE_POLICIES),
        "cases": cases,
        "seconds": time.perf_counter() - started,
    }
    name = args.name or f"planner-{args.gpu}"
    path = write_result(args.results_dir, torch.device("cpu"), name, record, markdown(record) + "\n")
    print(f"wrote {path.with_suffix('.md')}")
    return record
