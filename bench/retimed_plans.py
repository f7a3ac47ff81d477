"""Plans made from re-timed profiles: does every plan's predicted peak hold, whatever it chose?

    python -m bench.retimed_plans --workload tiny [--draws 6] [--fractions 0.9,0.8,0.7,0.6,0.5]

A session's plan depends on the times it measured (the layers', the host link's), and those
swing from run to run, so the plans :mod:`bench.peak_prediction` checks are a few of the many a
session may make. Here every plan the session makes comes from its profile with each layer's
forward and backward time drawn anew (uniformly between 0.2 and 5 times a fixed millisecond,
per layer name and draw) and the host link scaled by a draw of 0.01, 0.1, 1 or 10: the bytes,
and so the memory model, are the session's own, the choices far apart. For each draw and
budget (a fraction of the peak with everything kept) a session trains ``--steps`` steps and each
planned step's peak of allocated bytes is set against its prediction, as in
:mod:`bench.peak_prediction` (on CPU the allocator is
:class:`~lightning_accudnn.testing.OpBytesAllocator`).

The session is made to plan through this module's re-timing by replacing the planner it calls
(``lightning_accudnn.session.planning.plan_swaps``) for the run.

The record (JSON and a Markdown table) goes to ``--results-dir``/<device>/<date>-<name>.
"""

from __future__ import annotations

import argparse
import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import lightning_accudnn.session.planning as session_planning
from bench.environment import resolve_device
from bench.peak_prediction import add_budget_arguments, kept_run, record_header, session_peaks, summary
from bench.report import fmt_bytes, write_result
from bench.run import add_workload_arguments, parse_fraction, parse_list, workload_from_args
from lightning_accudnn.planner import Plan, StepProfile

LINK_SCALES = (0.01, 0.1, 1.0, 10.0)


def retimed(profile: StepProfile, draw: int) -> StepProfile:
    """``profile`` with each layer's times drawn for ``draw`` (by layer name) and its link scaled.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> profile = StepProfile((LayerProfile("a", 10, 10, 1.0, 2.0),), 0, 1e9, 1e9)
        >>> again = retimed(profile, 3)
        >>> again.layers[0].saved_bytes, again == retimed(profile, 3), again == retimed(profile, 4)
        (10, True, False)
    """

    def drawn(name: str, which: int) -> float:
        return random.Random(zlib.crc32(f"{draw}/{name}/{which}".encode())).uniform(0.2, 5.0)

    layers = tuple(
        replace(
            layer, forward_seconds=1e-3 * drawn(layer.name, 0), backward_seconds=2e-3 * drawn(layer.name, 1)
        )
        for layer in profile.layers
    )
    scale = random.Random(draw).choice(LINK_SCALES)
    return replace(
        profile,
        layers=layers,
        d2h_bytes_per_second=profile.d2h_bytes_per_second * scale,
        h2d_bytes_per_second=profile.h2d_bytes_per_second * scale,
    )


@contextmanager
def planning_retimed(draw: int) -> Iterator[None]:
    """Sessions plan from :func:`retimed` profiles while inside."""
    planner: Callable[..., Plan] = session_planning.plan_swaps

    def plan(profile: StepProfile, *args: Any, **kwargs: Any) -> Plan:
        return planner(retimed(profile, draw), *args, **kwargs)

    session_planning.plan_swaps = plan  # type: ignore[assignment]
    try:
        yield
    finally:
        session_planning.plan_swaps = planner  # type: ignore[assignment]


def markdown(record: dict[str, Any]) -> str:
    lines = [
        f"# Plans from re-timed profiles: {record['workload']} {record['params']} on {record['device']}",
        "",
        f"Allocator: {record['allocator']}. With everything kept the step allocated "
        f"{fmt_bytes(record['kept_peak_bytes'])} at its peak; each budget is a fraction of that "
        "(reserve 0), each draw re-times every plan's profile (see `bench/retimed_plans.py`). "
        "Worst: the largest measured over predicted peak of any planned step (above 1: a "
        "prediction fell short).",
        "",
        "| draw | fraction | recomputed | swapped | worst | steps above their prediction |",
        "|---|---|---|---|---|---|",
    ]
    for run in record["runs"]:
        if "refused" in run:
            lines.append(f"| {run['draw']} | {run['fraction']} | refused | | | |")
            continue
        excess = [step["peak_bytes"] - step["predicted_peak_bytes"] for step in run["steps"]]
        shown = ", ".join(f"+{fmt_bytes(extra)}" for extra in excess if extra > 0) or "none"
        lines.append(
            f"| {run['draw']} | {run['fraction']} | {run['recomputed_segments']} | "
            f"{fmt_bytes(run['swapped_bytes'])} | {run['worst']:.4f} | {shown} |"
        )
    above = sum(1 for run in record["runs"] if run.get("worst", 0.0) > 1.0)
    planned = sum(1 for run in record["runs"] if "refused" not in run)
    lines += ["", f"Runs with a step above its prediction: {above} of {planned} planned."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retimed_plans", description=__doc__.splitlines()[0]
    )
    add_workload_arguments(parser)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--policy", default="auto")
    add_budget_arguments(parser, fractions="0.9,0.8,0.7,0.6,0.5", steps=5)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    workload = workload_from_args(args)
    device = resolve_device(args.device)
    kept_peak = kept_run(workload, device, 3)["steps"][-1]["peak_bytes"]
    fractions = parse_list(args.fractions)
    runs = []
    for draw in range(1, args.draws + 1):
        for text in fractions:
            budget = int(parse_fraction(text) * kept_peak)
            with planning_retimed(draw):
                run = session_peaks(workload, device, budget, args.policy, args.steps)
            if "refused" not in run:
                run["worst"] = summary(run)["worst"]
            runs.append({"draw": draw, "fraction": text, **run})
            print(
                f"draw {draw} at {text}: " + ("refused" if "refused" in run else f"worst {run['worst']:.4f}")
            )
    record = {
        **record_header(workload, device),
        "kept_peak_bytes": kept_peak,
        "policy": args.policy,
        "runs": runs,
    }
    write_result(
        args.results_dir, device, args.name or f"retimed-plans-{workload.name}", record, markdown(record)
    )
    return record


if __name__ == "__main__":
    main()
