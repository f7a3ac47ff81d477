"""Plan again, on a CPU, a profile that ``bench.calibration`` recorded (on a GPU, say).

    python -m bench.replan bench/results/<device>/<date>-calibration-resnet152.json
    python -m bench.replan FILE --run kept --budget 3.7GB --policy recompute
    python -m bench.replan FILE --recompute-cost-ratio 1

Reads the profile the named session run (``fraction``, the default, or ``kept``) planned from,
plans it with the planner's public ``plan_swaps`` at the run's budget, reserve and profiling
peak (or the ``--budget`` and ``--policy`` given; ``--recompute-cost-ratio`` charges every
recomputation that many times the forward it repeats instead of what the run measured), and
prints the plan and, when the budget is the run's own, the run's measured steady step beside
the prediction. The session planned with
its host-memory limit too; with host memory for every swap, the plans are the same.

Example:
    >>> profile = profile_from_dict({"layers": [{"name": "a", "saved_bytes": 8, "swappable_bytes": 8}],
    ...                              "static_bytes": 0, "d2h_bytes_per_second": None})
    >>> profile.layers[0].name, profile.d2h_bytes_per_second
    ('a', inf)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from lightning_accudnn.planner import Budget, Plan, plan_swaps
from lightning_accudnn.profile import ExcludedSegment, LayerProfile, SegmentProfile, StepProfile

_PAIRS = ("resaved_by", "small_resaved_by", "resaved_by_module", "retired_alive_from")


def _pairs(items: list[list[Any]]) -> tuple[tuple[str, int], ...]:
    return tuple((str(name), int(nbytes)) for name, nbytes in items)


def profile_from_dict(data: dict[str, Any]) -> StepProfile:
    """The :class:`StepProfile` ``dataclasses.asdict`` wrote as JSON (infinite rates as ``None``)."""
    layers = []
    for layer in data["layers"]:
        fields = dict(layer)
        fields["small_storages"] = tuple(fields.get("small_storages", ()))
        for name in _PAIRS:
            fields[name] = _pairs(fields.get(name, []))
        layers.append(LayerProfile(**fields))
    segments = []
    for segment in data.get("segments", []):
        fields = dict(segment)
        fields["input_sources"] = _pairs(fields.get("input_sources", []))
        segments.append(SegmentProfile(**fields))
    return StepProfile(
        layers=tuple(layers),
        static_bytes=int(data["static_bytes"]),
        d2h_bytes_per_second=_rate(data.get("d2h_bytes_per_second")),
        h2d_bytes_per_second=_rate(data.get("h2d_bytes_per_second")),
        segments=tuple(segments),
        resaves_listed=bool(data.get("resaves_listed", False)),
        excluded_segments=tuple(ExcludedSegment(**item) for item in data.get("excluded_segments", [])),
        recompute_cost_ratio=float(data.get("recompute_cost_ratio", 1.0)),
        prefetch_order=tuple(
            (str(name), int(nbytes), int(least)) for name, nbytes, least in data.get("prefetch_order", [])
        ),
        swap_host_seconds=_seconds_pair(data.get("swap_host_seconds", (0.0, 0.0))),
    )


def _seconds_pair(values: list[float] | tuple[float, float]) -> tuple[float, float]:
    forward, backward = values
    return float(forward), float(backward)


def _rate(value: float | None) -> float:
    return float("inf") if value is None else float(value)


def replan(
    run: dict[str, Any],
    budget_bytes: int | None = None,
    policy: str | None = None,
    recompute_cost_ratio: float | None = None,
) -> Plan:
    """The plan of a calibration run's profile at ``budget_bytes`` (default: the run's) under
    ``policy`` (default: the run's), with the run's reserve and profiling peak, and every
    recomputation charged ``recompute_cost_ratio`` times its forward (default: as the run
    charged it: each timed segment its time, the others the run's ratio)."""
    recorded = run["plan"]
    profile = profile_from_dict(run["profile"])
    if recompute_cost_ratio is not None:  # every segment charged so, the timed ones too
        untimed = tuple(
            replace(segment, recompute_seconds=None, selective_recompute_seconds=None)
            for segment in profile.segments
        )
        profile = replace(profile, segments=untimed, recompute_cost_ratio=recompute_cost_ratio)
    return plan_swaps(
        profile,
        recorded["budget_bytes"] if budget_bytes is None else budget_bytes,
        recorded["reserve_bytes"],
        policy=recorded["policy"] if policy is None else policy,
        profiling_peak_bytes=recorded["profiling_peak_bytes"] or None,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.replan", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a bench.calibration JSON file")
    parser.add_argument("--run", choices=("fraction", "kept"), default="fraction")
    parser.add_argument("--budget", help='e.g. "3.7GB" (default: the run\'s own)')
    parser.add_argument("--policy", help="auto, swap, recompute or selective (default: the run's)")
    parser.add_argument(
        "--recompute-cost-ratio",
        type=float,
        help="a recomputation's time over the forward it repeats (default: what the run measured)",
    )
    return parser


def main(argv: list[str] | None = None) -> Plan:
    args = build_parser().parse_args(argv)
    record = json.loads(args.file.read_text())
    run = record[args.run]
    if "profile" not in run:
        raise SystemExit(
            f"bench.replan: run {args.run!r} of {args.file} holds no profile: {run.get('error')}"
        )
    budget = None
    if args.budget is not None:
        parsed = Budget.parse(args.budget)
        if parsed.kind != "bytes":
            raise SystemExit(f'bench.replan: --budget takes bytes ("3.7GB"), not {args.budget!r}')
        budget = int(parsed.value)
    plan = replan(run, budget, args.policy, args.recompute_cost_ratio)
    print(plan)
    if budget is None:
        print(
            f"\nthe run measured a median steady step of {run['median_wall_seconds'] * 1e3:.1f} ms "
            f"(wall) against the {plan.predicted_step_seconds * 1e3:.1f} ms predicted here"
        )
    return plan


if __name__ == "__main__":
    main()
