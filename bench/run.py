"""Run one workload under every memory strategy in one process and write the results.

    python -m bench.run --workload tiny --device cpu            # the CI smoke run, seconds
    python -m bench.run --workload resnet152 --precision bf16   # on a GPU
    python -m bench.run --workload gpt --param layers=12 --param seq_len=512

Writes ``<results-dir>/<device>/<date>-<name>.json``, ``.md``, ``.png`` (when matplotlib is
installed) and ``.log``. ``bench/README.md`` explains every column.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from bench.config import RunConfig, StrategySpec
from bench.environment import REPO_ROOT, device_slug, environment, resolve_device
from bench.host_profile import host_line
from bench.measure import PEAK_CUDA, PEAK_LEDGER
from bench.report import describe, fmt_bytes, markdown_table, output_stem, plot_rows, raw_log, write_json
from bench.row import ResultRow
from bench.runner import RunResult, fill_lower_bound, run_strategy
from bench.streams import where_line
from bench.workloads import WORKLOADS, Workload, make_workload
from lightning_accudnn.planner import Budget
from lightning_accudnn.planner.search import check_policy
from lightning_accudnn.profile import StepProfile

#: Strategy kinds in the order they run (the oracle first: its peak sets AccUDNN's budgets).
KINDS = ("oracle", "accudnn", "save_on_cpu", "torchtune", "checkpoint", "compile")

CPU_LABEL = (
    "CPU smoke run: the harness end to end on the CPU. Times are CPU times and peaks are the engine's "
    "ledger or the process's resident-set delta; no GPU memory or speed is shown by these figures."
)


def parse_list(text: str, kind: type = str) -> list[Any]:
    """A comma-separated option's items, stripped, empty ones left out, each made ``kind``.

    Example:
        >>> parse_list(" 0.9, 0.8,", float)
        [0.9, 0.8]
    """
    return [kind(item.strip()) for item in text.split(",") if item.strip()]


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workload``, ``--param KEY=VALUE``, ``--batch-size`` and ``--precision``: what
    :func:`workload_from_args` builds the workload from."""
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a workload size parameter, e.g. layers=12, seq_len=512, depth=1001, image_size=224",
    )
    parser.add_argument("--batch-size", type=int, help="shortcut for --param batch_size=N")
    parser.add_argument("--precision", choices=("fp32", "bf16"), help="shortcut for --param precision=...")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    add_workload_arguments(parser)
    parser.add_argument(
        "--device", default="auto", help='"auto" (CUDA if present), "cpu", "cuda" or "cuda:N"'
    )
    parser.add_argument(
        "--strategies", default=",".join(KINDS), help=f"comma-separated subset of {', '.join(KINDS)}"
    )
    parser.add_argument(
        "--reductions",
        default="2,3,4",
        help="AccUDNN budgets as divisors of the oracle's measured peak (default 2,3,4)",
    )
    parser.add_argument(
        "--activation-fractions",
        default="",
        help="AccUDNN budgets as the model state plus these shares of the oracle's activations (its "
        'peak less its model state), e.g. "1/2,1/3"; rows accudnn-static+1/2act, ... (default none)',
    )
    parser.add_argument(
        "--budgets", default="", help='extra AccUDNN budgets in bytes or units, e.g. "8GB,12GB"'
    )
    parser.add_argument(
        "--policies",
        default="auto,swap",
        help="AccUDNN policies side by side for each budget (auto rows keep the plain name, the "
        "others get a -POLICY suffix); default auto,swap",
    )
    parser.add_argument(
        "--compile-memory-budgets", default="0.5", help="activation_memory_budget values (0..1)"
    )
    parser.add_argument(
        "--compile-backend",
        default="auto",
        help='torch.compile backend; "auto": inductor on CUDA, aot_eager_decomp_partition on CPU',
    )
    parser.add_argument("--warmup", type=int, help="warm-up steps (default 3; tiny: 2)")
    parser.add_argument("--steps", type=int, help="measured steps (default 10; tiny: 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--min-swap-bytes", type=int, help="AccUDNN min_swap_bytes (default: the workload's or 1 MiB)"
    )
    parser.add_argument("--reserve-bytes", type=int, help="AccUDNN reserve_bytes (default: the strategy's)")
    parser.add_argument(
        "--host-memory-limit", help='AccUDNN host_memory_limit, e.g. "64GB" (default: half of RAM)'
    )
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", help="result file name after the date (default: from the workload)")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    return parser


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload the arguments of :func:`add_workload_arguments` name."""
    overrides: dict[str, Any] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--param needs KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    if args.batch_size is not None:
        overrides["batch_size"] = args.batch_size
    if args.precision is not None:
        overrides["precision"] = args.precision
    try:
        return make_workload(args.workload, **overrides)
    except (TypeError, ValueError) as error:
        raise SystemExit(f"bench.run: {error}") from error


def default_name(workload: Workload) -> str:
    """File name of a run: the workload, its depth or precision.

    Example:
        >>> from bench.workloads import deep_resnet, resnet152
        >>> default_name(resnet152(precision="fp32")), default_name(deep_resnet(depth=152))
        ('resnet152-fp32', 'deep_resnet-d152-fp32')
    """
    if workload.name == "tiny":
        return "tiny"
    if workload.name == "deep_resnet":
        return f"deep_resnet-d{workload.params['depth']}-{workload.precision}"
    return f"{workload.name}-{workload.precision}"


def parse_fraction(text: str) -> float:
    """A share written as a decimal or as ``a/b``.

    Example:
        >>> parse_fraction("1/3") == 1 / 3, parse_fraction("0.5")
        (True, 0.5)
    """
    numerator, slash, denominator = text.partition("/")
    value = float(numerator) / float(denominator) if slash else float(text)
    if not 0 < value <= 1:
        raise ValueError(f"an activation fraction must be in (0, 1], got {text!r}")
    return value


def activation_budget(oracle_peak: int, static_bytes: int, fraction: float) -> int:
    """The model state plus ``fraction`` of the oracle's activations (its peak less the model state).

    Example:
        >>> activation_budget(1000, 400, 0.5)
        700
    """
    return static_bytes + int(max(oracle_peak - static_bytes, 0) * fraction)


def specs_for(
    args: argparse.Namespace,
    oracle_peak: int | None,
    compile_backend: str,
    static_bytes: int | None = None,
) -> list[StrategySpec]:
    """The rows after the oracle, in run order; AccUDNN budgets from the oracle's peak (and, for
    ``--activation-fractions``, its model state ``static_bytes``)."""
    kinds = set(parse_list(args.strategies))
    specs: list[StrategySpec] = []
    if "accudnn" in kinds:
        policies = parse_list(args.policies)
        for policy in policies:
            check_policy(policy)
        suffixes = {policy: "" if policy == "auto" else f"-{policy}" for policy in policies}
        for reduction in parse_list(args.reductions, float):
            for policy, suffix in suffixes.items():
                params: dict[str, Any] = {"reduction": reduction, "policy": policy}
                if oracle_peak is not None:
                    params["budget_bytes"] = int(oracle_peak / reduction)
                specs.append(StrategySpec(f"accudnn-{reduction:g}x{suffix}", "accudnn", params))
        for text in parse_list(args.activation_fractions):
            fraction = parse_fraction(text)
            for policy, suffix in suffixes.items():
                params = {"activation_fraction": fraction, "policy": policy}
                if oracle_peak is not None and static_bytes is not None:
                    params["budget_bytes"] = activation_budget(oracle_peak, static_bytes, fraction)
                specs.append(StrategySpec(f"accudnn-static+{text}act{suffix}", "accudnn", params))
        for text in parse_list(args.budgets):
            budget = Budget.parse(int(text) if text.isdigit() else text)
            if budget.kind != "bytes":
                raise ValueError(f"--budgets takes sizes (bytes, GB, GiB...), got {text!r}")
            for policy, suffix in suffixes.items():
                params = {"budget_bytes": int(budget.value), "policy": policy}
                specs.append(StrategySpec(f"accudnn-{text}{suffix}", "accudnn", params))
    if "save_on_cpu" in kinds:
        specs.append(StrategySpec("save_on_cpu", "save_on_cpu", {"pin_memory": True}))
    if "torchtune" in kinds:
        specs.append(StrategySpec("torchtune", "torchtune", {"use_pin_memory": True}))
    if "checkpoint" in kinds:
        specs.append(StrategySpec("checkpoint", "checkpoint", {"use_reentrant": False}))
    if "compile" in kinds:
        for fraction in parse_list(args.compile_memory_budgets, float):
            specs.append(
                StrategySpec(
                    f"compile-amb{fraction:g}",
                    "compile",
                    {"activation_memory_budget": fraction, "backend": compile_backend},
                )
            )
    return specs


def oracle_peak_of(row: ResultRow) -> tuple[int | None, str | None]:
    """The oracle's peak that AccUDNN budgets divide: allocator bytes on CUDA, ledger bytes on CPU."""
    if row.status != "ok":
        return None, None
    if row.peak_source == PEAK_CUDA:
        return row.peak_allocated_bytes, PEAK_CUDA
    if row.ledger_peak_bytes:
        return row.ledger_peak_bytes, "engine_ledger (model state + saved activations, one untimed step)"
    return None, None


def peak_reduction(oracle: ResultRow | None, row: ResultRow) -> float | None:
    """Oracle peak over this row's peak, counted the same way (``None`` if not comparable).

    Example:
        >>> oracle = ResultRow("oracle", "oracle", status="ok", peak_source="cuda_allocator",
        ...                    peak_allocated_bytes=400)
        >>> row = ResultRow("accudnn-4x", "accudnn", status="ok", peak_source="cuda_allocator",
        ...                 peak_allocated_bytes=100)
        >>> peak_reduction(oracle, row)
        4.0
    """
    if oracle is None or oracle.status != "ok" or row.status != "ok" or not row.peak_allocated_bytes:
        return None
    if row.peak_source == PEAK_CUDA and oracle.peak_source == PEAK_CUDA and oracle.peak_allocated_bytes:
        return oracle.peak_allocated_bytes / row.peak_allocated_bytes
    if row.peak_source == PEAK_LEDGER and oracle.ledger_peak_bytes:
        return oracle.ledger_peak_bytes / row.peak_allocated_bytes
    return None  # resident-set deltas of rows run one after another in one process do not compare


def _section(title: str, items: list[str]) -> list[str]:
    """A report's section: ``title``, then ``items`` (none at all without items).

    Example:
        >>> _section("Notes:", ["- a"]), _section("Notes:", [])
        (['Notes:', '', '- a', ''], [])
    """
    return [title, "", *items, ""] if items else []


def _markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    workload = result["workload"]
    lines = [f"# {workload['name']} on {env['device']} ({env['date_utc'][:10]})", ""]
    if result.get("label"):
        lines += [f"**{result['label']}**", ""]
    git = env["git"]
    lines += [
        f"- device: {env['device']}; torch {env['torch']}, CUDA {env['cuda']}, driver {env['driver']}, "
        f"cuDNN {env['cudnn']}",
        f"- commit: {git['commit']}"
        + (f" (working tree differs: {', '.join(git['dirty_paths'])})" if git["dirty"] else ""),
        f"- workload: {workload['params']}",
        f"- config: {result['config']}",
        f"- oracle peak that the AccUDNN budgets divide: {fmt_bytes(result['oracle_peak_bytes'])} "
        f"({result['oracle_peak_source']}); its model state (the static part of the "
        f"static + activation-fraction budgets): {fmt_bytes(result.get('oracle_static_bytes'))}",
        "",
        markdown_table(result["rows"]),
    ]
    notes = [
        f"- {row['name']}: {note}"
        for row in result["rows"]
        for note in [*(row.get("notes") or []), *([row["error"]] if row.get("error") else [])]
    ]
    if notes:
        lines += ["Notes and errors:", "", *notes, ""]
    lines += _section(
        "Where the time went: one more step after the measured ones, under `torch.profiler` "
        "(its host wall time includes the profiler's own cost; see bench/README.md):",
        [line for row in result["rows"] for line in where_line(row["name"], row.get("streams"))],
    )
    lines += _section(
        "Where the host's time went: two more steps under `cProfile`, its own cost included (compare "
        "rows with each other, not with the measured steps; see bench/host_profile.py):",
        [line for row in result["rows"] for line in host_line(row["name"], row.get("host_profile"))],
    )
    plot = result["plot"]
    lines += [
        f"Plot: {plot['path'] if plot['written'] else plot['reason']}. Raw log: {result['files']['log']}. "
        "Columns: see bench/README.md. Every figure was written by the run that measured it.",
        "",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every selected strategy on the workload; write and return the result."""
    device = resolve_device(args.device)
    workload = workload_from_args(args)
    kinds = set(parse_list(args.strategies))
    unknown = kinds - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown strategies {sorted(unknown)}; choose from {', '.join(KINDS)}")
    try:
        specs_for(args, oracle_peak=1, compile_backend="inductor", static_bytes=0)  # check the lists now
    except ValueError as error:
        raise SystemExit(f"bench.run: {error}") from error
    tiny = workload.name == "tiny"
    compile_backend = (
        args.compile_backend
        if args.compile_backend != "auto"
        else ("inductor" if device.type == "cuda" else "aot_eager_decomp_partition")
    )
    config = RunConfig(
        device=device,
        warmup=args.warmup if args.warmup is not None else (2 if tiny else 3),
        steps=args.steps if args.steps is not None else (3 if tiny else 10),
        seed=args.seed,
        min_swap_bytes=args.min_swap_bytes if args.min_swap_bytes is not None else workload.min_swap_bytes,
        reserve_bytes=args.reserve_bytes,
        host_memory_limit=args.host_memory_limit,
        compile_backend=compile_backend,
    )
    stem = output_stem(args.results_dir, device_slug(device), args.name or default_name(workload))
    files = {
        "json": stem.name + ".json",
        "markdown": stem.name + ".md",
        "png": None,
        "log": stem.name + ".log",
    }
    started = time.time()
    with raw_log(stem.with_suffix(".log")):
        env = environment(device)
        print(f"bench.run: {workload.name} {workload.params} on {env['device']} (torch {env['torch']})")
        print(f"bench.run: writing {stem}.*")
        rows: list[ResultRow] = []
        oracle_row = None
        if "oracle" in kinds or "accudnn" in kinds:
            oracle_row = _run_row(workload, StrategySpec("oracle", "oracle"), config).row
            rows.append(oracle_row)
        oracle_peak, oracle_source = oracle_peak_of(oracle_row) if oracle_row else (None, None)
        static_bytes = oracle_row.static_bytes if oracle_row else None
        reference: tuple[str, StepProfile] | None = None
        for spec in specs_for(args, oracle_peak, compile_backend, static_bytes):
            if spec.kind == "accudnn" and "budget_bytes" not in spec.params:
                rows.append(
                    ResultRow(
                        spec.name,
                        spec.kind,
                        params=spec.params,
                        status="skipped",
                        error="the oracle measured no peak to divide",
                    )
                )
                continue
            result = _run_row(workload, spec, config)
            row, profile = result.row, result.profile
            rows.append(row)
            if reference is None and profile is not None and row.status == "ok":
                reference = (spec.name, profile)
        for row in rows:
            if reference is not None:
                fill_lower_bound(row, reference[0], reference[1], device)
            row.peak_reduction = peak_reduction(oracle_row, row) if row is not oracle_row else None
        row_data = [row.as_dict() for row in rows]
        result_data: dict[str, Any] = {
            "kind": "bench.run",
            "schema": 1,
            "label": CPU_LABEL if device.type == "cpu" else None,
            "workload": {
                "name": workload.name,
                "params": workload.params,
                "samples_per_step": workload.samples,
            },
            "config": {
                "warmup": config.warmup,
                "steps": config.steps,
                "seed": config.seed,
                "distinct_batches": config.distinct_batches,
                "min_swap_bytes": config.min_swap_bytes,
                "reserve_bytes": config.reserve_bytes,
                "host_memory_limit": config.host_memory_limit,
                "compile_backend": config.compile_backend,
                "reductions": parse_list(args.reductions, float),
                "activation_fractions": parse_list(args.activation_fractions),
                "strategies": sorted(kinds, key=KINDS.index),
                "argv": sys.argv[1:],
            },
            "environment": env,
            "oracle_peak_bytes": oracle_peak,
            "oracle_peak_source": oracle_source,
            "oracle_static_bytes": static_bytes,
            "lower_bound_profile": reference[0] if reference else None,
            "rows": row_data,
            "files": files,
        }
        png = stem.with_suffix(".png")
        if args.no_plot:
            result_data["plot"] = {"written": False, "reason": "--no-plot"}
        else:
            title = f"{workload.name} ({describe(workload.params)}) on {env['device']}"
            result_data["plot"] = plot_rows(
                png, row_data, title if device.type == "cuda" else f"{title} (CPU smoke run)"
            )
        if result_data["plot"]["written"]:
            files["png"] = png.name
        result_data["wall_seconds"] = time.time() - started
        markdown = _markdown(result_data)
        stem.with_suffix(".md").write_text(markdown, encoding="utf-8")
        write_json(stem.with_suffix(".json"), result_data)
        print(markdown)
        print(
            f"bench.run: wrote {stem}.json, .md, .log" + (", .png" if files["png"] else " (no PNG: see JSON)")
        )
    return result_data


def _run_row(workload: Workload, spec: StrategySpec, config: RunConfig) -> RunResult:
    print(f"bench.run: {spec.name} ...", flush=True)
    started = time.time()
    result = run_strategy(workload, spec, config)
    row = result.row
    print(
        f"bench.run: {spec.name}: {row.status}"
        + (f" ({row.error_type}: {row.error})" if row.status != "ok" else "")
        + f" in {time.time() - started:.1f} s",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m bench.run``; returns the result written."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
