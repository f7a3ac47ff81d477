"""Predicted against measured peaks, plan by plan: how close a training session's memory model is.

    python -m bench.peak_prediction --workload tiny [--fractions 0.9,0.8,0.7,0.6] [--policies auto,recompute]
    python -m bench.peak_prediction --workload gpt --param layers=4 --param d_model=128 --param vocab=8000
    python -m bench.peak_prediction --workload tiny --rows 8,12,16,10,14  # batch shapes that vary

First the workload trains with everything kept (an ample budget) for its peak of allocated
bytes. Then, for each fraction of that peak as the budget and each policy, an
:class:`~lightning_accudnn.OffloadSession` (plans made inline) trains ``--steps`` steps, and every
planned step's peak of allocated bytes is set against the peak its plan predicted
(:attr:`~lightning_accudnn.session.OffloadStats.predicted_peak_bytes`). On CUDA the allocator is
CUDA's, and the session keeps its default reserve: it caps the allocator at the budget, the cap
counts reserved bytes, and reserved but unallocated bytes need room (at reserve 0 ResNet-152 ran
out of memory at every budget on the H200, its allocated bytes below the predicted peaks). On CPU
it is :class:`~lightning_accudnn.testing.OpBytesAllocator` (the tensors the step's ops create, the
optimizer's step and its state included; no kernel workspaces), which the session measures
working memory against as it does on a GPU, at reserve 0. A prediction below the measured peak is
a broken promise; one far above leaves memory unused. A run whose step went past the session's
cap ends there: the record names the step, whether it was the profiling pass or a planned one,
and that plan's predicted peak. With ``--rows`` each step takes,
in turn, that many rows of the workload's batch: a batch shape first met after others is planned
from their profiles, scaled to it (``scaled`` steps), and the budgets are fractions of the kept
run's largest peak.

The record (JSON and a Markdown table) goes to ``--results-dir``/<device>/<date>-<name>.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT, resolve_device
from bench.report import fmt_bytes, write_result
from bench.run import add_workload_arguments, parse_fraction, parse_list, workload_from_args
from bench.runner import autocast_for, batch_on
from bench.workloads import Workload
from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import BudgetTooSmallError
from lightning_accudnn.testing import OpBytesAllocator

POLICIES = ("auto", "swap", "recompute", "selective")


def _allocator(model: torch.nn.Module, device: torch.device) -> OpBytesAllocator | None:
    """CPU: the ops' tensors as the allocator's count (not the engine's host buffers, which are
    host memory on a GPU); CUDA: ``None``, the session reads CUDA's."""
    if device.type == "cuda":
        return None
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return OpBytesAllocator(parameters)


def session_peaks(
    workload: Workload,
    device: torch.device,
    budget: int | str,
    policy: str,
    steps: int,
    rows: Sequence[int] = (),
) -> dict[str, Any]:
    """``steps`` steps of ``workload`` under ``budget`` and ``policy``, step ``i`` on the first
    ``rows[i % len(rows)]`` rows of its batch (all without ``rows``): per planned step its
    allocated and predicted peaks, and the last plan's choices (or the refusal)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = workload.build()
    optimizer = workload.optimizer(model)
    allocator = _allocator(model, device)
    min_swap = 0 if workload.min_swap_bytes is None else workload.min_swap_bytes
    config = OffloadConfig(
        budget=budget,
        min_swap_bytes=min_swap,
        plan_in_background=False,
        policy=policy,
        reserve_bytes=0 if device.type == "cpu" else None,
    )
    session = OffloadSession(config, device, allocator=allocator)
    steps_seen: list[dict[str, Any]] = []
    try:
        for index in range(steps):
            with allocator.counting() if allocator is not None else nullcontext():
                batch = workload.make_batch(index % 2)
                if rows:
                    taken = rows[index % len(rows)]  # copies: a view would hold the whole batch
                    batch = (batch[0][:taken].clone(), batch[1][:taken].clone())
                batch = batch_on(batch, device)
                with session.step(model, [optimizer]), autocast_for(workload, device):
                    loss = workload.loss(model, batch)
                loss.backward()
                del loss, batch
                optimizer.step()  # its state and temporaries are the device's, as on a GPU
                optimizer.zero_grad(set_to_none=True)
            stats = session.stats
            if stats is not None and stats.predicted_peak_bytes is not None:
                steps_seen.append(
                    {
                        "rows": rows[index % len(rows)] if rows else workload.batch_size,
                        "source": None if stats.plan_source is None else stats.plan_source.value,
                        "peak_bytes": stats.peak_device_bytes,
                        "predicted_peak_bytes": stats.predicted_peak_bytes,
                        "reserve_bytes": session.reserve_bytes,
                    }
                )
    except BudgetTooSmallError as error:
        return {"budget": budget, "policy": policy, "refused": str(error)}
    except torch.OutOfMemoryError as error:  # past the session's cap: what the step needed beyond its room
        where = "the profiling pass" if session.plan is None else "a planned pass"
        plan_peak = None if session.plan is None else session.plan.predicted_peak_bytes
        return {
            "budget": budget,
            "policy": policy,
            "out_of_memory": f"step {index + 1} ({where}): {str(error).splitlines()[0]}",
            "plan_predicted_peak_bytes": plan_peak,
            "steps": steps_seen,
        }
    finally:
        session.close()
    plan = session.plan
    return {
        "budget": budget,
        "policy": policy,
        "steps": steps_seen,
        "recomputed_segments": 0 if plan is None else len(plan.recomputed),
        "swapped_bytes": 0 if plan is None else plan.swapped_bytes,
    }


def kept_run(
    workload: Workload, device: torch.device, steps: int, rows: Sequence[int] = ()
) -> dict[str, Any]:
    """``steps`` steps of ``workload`` (on ``rows`` of its batches, as :func:`session_peaks`)
    with everything kept (an ample budget): the run whose peak the budgets are fractions of."""
    return session_peaks(workload, device, "100%" if device.type == "cpu" else "90%", "auto", steps, rows)


def kept_peak_bytes(kept: dict[str, Any], rows: Sequence[int] = ()) -> int:
    """The kept run's last step's peak; with ``rows`` (batch shapes that vary) its largest.

    Example:
        >>> kept = {"steps": [{"peak_bytes": 90}, {"peak_bytes": 120}, {"peak_bytes": 100}]}
        >>> kept_peak_bytes(kept), kept_peak_bytes(kept, rows=[8, 16, 12])
        (100, 120)
    """
    peaks = [step["peak_bytes"] for step in kept["steps"]]
    return max(peaks) if rows else peaks[-1]


def allocator_name(device: torch.device) -> str:
    """The allocator the peaks are read from on ``device``, as a record names it."""
    if device.type == "cuda":
        return "CUDA's caching allocator"
    return "OpBytesAllocator (the tensors the step's ops and its optimizer create)"


def record_header(workload: Workload, device: torch.device) -> dict[str, Any]:
    """What a record of budgets set against a kept peak opens with: the workload, its sizes, the
    device and the allocator the peaks are read from."""
    return {
        "workload": workload.name,
        "params": workload.params,
        "device": str(device),
        "allocator": allocator_name(device),
    }


def add_budget_arguments(parser: argparse.ArgumentParser, *, fractions: str, steps: int) -> None:
    """``--fractions`` (of the kept peak, as budgets; ``fractions`` by default), ``--steps`` (per
    run; ``steps``), ``--name`` and ``--results-dir``: the options this module and
    :mod:`bench.retimed_plans` share."""
    parser.add_argument("--fractions", default=fractions, help="of the kept peak, as budgets")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--name", default=None)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """The last planned step's peaks and their ratio, and the most any step's fell short
    (measured over predicted, above 1 when a prediction was below the peak).

    Example:
        >>> steps = [
        ...     {"peak_bytes": 90, "predicted_peak_bytes": 100},
        ...     {"peak_bytes": 98, "predicted_peak_bytes": 100},
        ... ]
        >>> summary({"steps": steps})["over"], summary({"steps": steps})["worst"]
        (0.0204, 0.98)
    """
    steps = run.get("steps") or []
    if not steps:
        return {}
    last = steps[-1]
    return {
        "peak_bytes": last["peak_bytes"],
        "predicted_peak_bytes": last["predicted_peak_bytes"],
        "over": round(last["predicted_peak_bytes"] / last["peak_bytes"] - 1, 4),
        "worst": round(max(step["peak_bytes"] / step["predicted_peak_bytes"] for step in steps), 4),
    }


def markdown(record: dict[str, Any]) -> str:
    lines = [
        f"# Predicted against measured peaks: {record['workload']} {record['params']} on {record['device']}",
        "",
        f"Allocator: {record['allocator']}. With everything kept the step allocated "
        f"{fmt_bytes(record['kept_peak_bytes'])} at its peak; each budget is a fraction of that "
        + ("(reserve 0)" if record["device"] == "cpu" else "(the session's default reserve)")
        + (
            f"; step after step the batch takes {record['rows']} of its rows, in turn"
            if record.get("rows")
            else ""
        )
        + ". Per run: the last planned step's measured and predicted peaks, the prediction "
        "over the measured, and the largest measured over predicted of any planned step (above 1: a "
        "prediction fell short).",
        "",
        "| fraction | policy | budget | recomputed | swapped | measured peak | predicted peak | over "
        "| worst |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in record["runs"]:
        if "refused" in run or "out_of_memory" in run:
            failure = (
                f"refused: {run['refused']}"
                if "refused" in run
                else f"out of memory at {run['out_of_memory']}"
            )
            lines.append(
                f"| {run['fraction']} | {run['policy']} | {fmt_bytes(run['budget'])} | {failure[:160]} |||||"
            )
            continue
        cells = summary(run)
        lines.append(
            f"| {run['fraction']} | {run['policy']} | {fmt_bytes(run['budget'])} "
            f"| {run['recomputed_segments']} | {fmt_bytes(run['swapped_bytes'])} "
            f"| {fmt_bytes(cells.get('peak_bytes'))} | {fmt_bytes(cells.get('predicted_peak_bytes'))} "
            f"| {cells.get('over', 0):+.1%} | {cells.get('worst', 0):.3f} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peak_prediction", description=__doc__.splitlines()[0]
    )
    add_workload_arguments(parser)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--policies", default="auto,recompute", help=f"of {', '.join(POLICIES)}")
    add_budget_arguments(parser, fractions="0.9,0.8,0.7,0.6", steps=6)
    parser.add_argument(
        "--rows",
        default="",
        help="rows of the workload's batch each step takes, in turn (batch shapes that vary); default: all",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    workload = workload_from_args(args)
    device = resolve_device(args.device)
    policies = parse_list(args.policies)
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        raise SystemExit(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}")
    fractions = parse_list(args.fractions)
    rows = parse_list(args.rows, int)
    if any(not 0 < taken <= workload.batch_size for taken in rows):
        raise SystemExit(
            f"--rows: each must be in 1..{workload.batch_size} (the workload's batch size), got {rows}"
        )
    kept = kept_run(workload, device, args.steps, rows)
    kept_peak = kept_peak_bytes(kept, rows)
    runs = []
    for text in fractions:
        for policy in policies:
            budget = int(parse_fraction(text) * kept_peak)
            run = session_peaks(workload, device, budget, policy, args.steps, rows)
            runs.append({"fraction": text, **run})
            cells = summary(run)
            failure = run.get("refused") or run.get("out_of_memory")
            print(f"{text} {policy}: " + (failure[:100] if failure else str(cells)))
    record = {
        **record_header(workload, device),
        "kept": kept,
        "kept_peak_bytes": kept_peak,
        "rows": rows,
        "runs": runs,
        "argv": list(argv) if argv is not None else None,
    }
    name = args.name or f"peak-prediction-{workload.name}"
    write_result(args.results_dir, device, name, record, markdown(record))
    return record


if __name__ == "__main__":
    main()
