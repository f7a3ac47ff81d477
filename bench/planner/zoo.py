"""``python -m bench.planner.zoo``: ``accudnn plan`` of every torchvision model that takes one
tensor (classification, segmentation, video and the float form of the quantization models),
each at its default input shape, and whether it traces and plans.

    python -m bench.planner.zoo                                  # every such model, batch 2, bf16, H100
    python -m bench.planner.zoo --models resnet18,vit_b_16       # some

Detection and optical-flow models are left out: their training forward takes targets or pairs of
images, which the command's one batch tensor cannot give.

Runs the command line itself (:func:`lightning_accudnn.cli.main` with ``--json``) for each model
in this process, with a budget far above any of them (so that each plans: what is checked is that
the model can be traced, not a plan's quality), and writes ``<results-dir>/cpu/<date>-<name>.json``
and ``.md``: per model its exit status, its predicted step and saved activations, or the error the
command printed, and the wall-clock seconds it took on this machine's CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT, git_commit
from bench.report import write_result
from lightning_accudnn.cli import main as accudnn

__all__ = ["FAMILIES", "main", "markdown", "plan_model"]

#: torchvision's model modules whose models take one batch tensor.
FAMILIES = ("", "segmentation", "video", "quantization")


def plan_model(name: str, batch_size: int, dtype: str, gpu: str) -> dict[str, Any]:
    """``accudnn plan torchvision:<name>`` at its default input shape: exit status, seconds, and
    the predicted step and saved bytes, or the last line of what it printed to stderr.

    Example:
        >>> row = plan_model("resnet18", 2, "bf16", "h100")
        >>> row["status"], row["saved_bytes"] > 0
        (0, True)
    """
    out, err = io.StringIO(), io.StringIO()
    args = ["plan", f"torchvision:{name}", "--batch-size", str(batch_size), "--budget", "80GB"]
    args += ["--gpu", gpu, "--dtype", dtype, "--reserve", "0", "--json"]
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = accudnn(args)
    row: dict[str, Any] = {"model": name, "status": status, "seconds": time.perf_counter() - started}
    if status == 0:
        report = json.loads(out.getvalue())
        row["predicted_step_seconds"] = report["predicted_step_seconds"]
        row["saved_bytes"] = report["saved_bytes"]
        row["input_shape"] = report["input_shape"]
    else:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        row["error"] = lines[-1] if lines else ""
    return row


def markdown(record: dict[str, Any]) -> str:
    """The record as a table: one row per model.

    Example:
        >>> rows = [{"model": "m", "status": 1, "seconds": 0.5, "error": "accudnn: error: no"}]
        >>> record = {"commit": "abc", "batch_size": 2, "dtype": "bf16", "gpu": "h100", "rows": rows}
        >>> markdown(record).splitlines()[-1]
        '| m | 1 | accudnn: error: no | 0.5 |'
    """
    rows = record["rows"]
    planned = sum(1 for row in rows if row["status"] == 0)
    lines = [
        f"# accudnn plan of every torchvision model that takes one tensor, at {record['commit']}",
        "",
        f"`accudnn plan torchvision:NAME --batch-size {record['batch_size']} --dtype {record['dtype']} "
        f"--gpu {record['gpu']} --budget 80GB --reserve 0` for each model at its default input shape, "
        "in one process on this machine's CPU: whether it traces and plans. "
        f"{planned} of {len(rows)} planned.",
        "",
        "| model | exit status | predicted step (ms), saved activations (MB), or the error | seconds |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        if row["status"] == 0:
            outcome = f"{row['predicted_step_seconds'] * 1e3:.3f} ms, {row['saved_bytes'] / 1e6:.1f} MB"
        else:
            outcome = row["error"].replace("|", "\\|")
        lines.append(f"| {row['model']} | {row['status']} | {outcome} | {row['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated torchvision names (default: every one of FAMILIES)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", default="planner-zoo")
    args = parser.parse_args(argv)
    import torchvision

    modules = [getattr(torchvision.models, family) if family else torchvision.models for family in FAMILIES]
    every = [name for module in modules for name in torchvision.models.list_models(module=module)]
    names = args.models.split(",") if args.models else every
    rows = []
    for name in names:
        row = plan_model(name, args.batch_size, args.dtype, args.gpu)
        outcome = "planned" if row["status"] == 0 else row["error"]
        print(f"{name}: {outcome} ({row['seconds']:.1f} s)", flush=True)
        rows.append(row)
    record = {
        "kind": "planner-zoo",
        "commit": git_commit(),
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "gpu": args.gpu,
        "rows": rows,
    }
    write_result(args.results_dir, torch.device("cpu"), args.name, record, markdown(record))
    return 0 if all(row["status"] == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
