"""``python -m bench.overhead``: the strategy's host cost per step, on the CPU, and where it is written.

    python -m bench.overhead            # about 3 minutes on a shared 2-core machine
    python -m bench.overhead --quick    # seconds: checks that everything runs (CI), figures not for use
    python -m bench.overhead --device cuda   # on a GPU (steps synchronised at their boundaries)

Writes ``<results-dir>/<device>/<date>-overhead.json``, ``.md`` and ``.log`` (``cpu`` or the
GPU's name as the folder, ``-quick`` in the name for ``--quick``). ``bench/README.md``
("Host overhead") explains every figure.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT, device_slug, environment, resolve_device
from bench.overhead import figures
from bench.overhead.budgets import budget_swapping_half
from bench.overhead.fits import DEFAULT_STRATEGY, FitResult, accudnn, run_fit
from bench.overhead.floor import measure_floor
from bench.overhead.models import (
    adds,
    count_step,
    deep_narrow,
    tanhs,
    tiny_gpt2_medium,
    tiny_resnet152,
    unused_parameters,
)
from bench.overhead.projection import REAL_TARGETS, PlanTarget, predict
from bench.report import output_stem, raw_log, write_json
from bench.workloads import Workload
from lightning_accudnn import OffloadConfig
from lightning_accudnn.session import default_reserve_bytes
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES

#: The steps every fit warms up for (see :attr:`Settings.warmup`).
WARMUP = 2 + TIMED_PLANNED_PASSES + OffloadConfig().observe_every

#: A budget far above anything these models need: the planner swaps nothing.
AMPLE_BUDGET = "8GB"
#: ``min_swap_bytes`` of the deep narrow model half swapped with its LayerNorm statistics kept:
#: above their 16 bytes (a mean or a reciprocal deviation per row of 4), below the 1 KiB of an
#: activation (4 x 64 floats). The default 1 MiB draws that line at real sizes (width 4096 and
#: batch 64: 1 MiB activations, 256-byte statistics); these models are too small for it.
STATISTICS_KEPT_MIN_SWAP_BYTES = 256

CPU_LABEL = (
    "CPU host-overhead benchmark: wall-clock times of this CPU (torch on 1 thread, a shared machine), "
    "medians of interleaved repeated runs with their spread [lowest, highest]. Not GPU figures; the H100 "
    "steps are the planner's datasheet estimates, not measurements."
)
GPU_LABEL = (
    "GPU host-overhead run: wall-clock step times with the device synchronised at each step's start and "
    "end (torch on 1 CPU thread), medians of interleaved repeated runs with their spread [lowest, highest]. "
    "The H100 steps are the planner's datasheet estimates."
)
QUICK_LABEL = (
    "--quick run: checks that the benchmark runs end to end; its figures are not for use. " + CPU_LABEL
)


@dataclass(frozen=True)
class Settings:
    """Sizes and repeats of one run (the default, or ``--quick``)."""

    units: int = 1000
    unused_parameters: int = 2000
    deep_layers: int = 333
    resnet_depth: int = 152
    gpt_layers: int = 24
    repeats: int = 5
    #: profiling, the timed planned passes and the first replay (observed), then one whole cycle
    #: of observed passes (``observe_every``, 8) to hold the passes timed whole under the refined
    #: plan and under the plan they may re-cost it into: the steady state, at the same place in
    #: the cycle as the first replays
    warmup: int = WARMUP
    steps: int = 4
    floor_repeats: int = 6
    floor_steps: int = 10
    targets: tuple[PlanTarget, PlanTarget] = (REAL_TARGETS["resnet152"], REAL_TARGETS["gpt2_medium"])


QUICK = Settings(
    units=60,
    unused_parameters=100,
    deep_layers=12,
    resnet_depth=14,
    gpt_layers=2,
    repeats=2,
    warmup=WARMUP,
    steps=2,
    floor_repeats=2,
    floor_steps=3,
    targets=(
        PlanTarget(
            "ResNet-18, batch 1, 64x64 (quick: not the real size)", "torchvision:resnet18", 1, "3,64,64"
        ),
        replace(
            REAL_TARGETS["gpt2_medium"],
            name="GPT-2 medium widths, 2 blocks, batch 1, 8 tokens (quick: not the real size)",
            model="bench.overhead.models:gpt2_medium_two_blocks",
            batch_size=1,
            input_shape="8",
        ),
    ),
)


@dataclass(frozen=True)
class Variant:
    """One fit of the interleaved loop: its name, workload and strategy (default or a factory)."""

    name: str
    workload: Workload
    strategy: Any


def _workloads(settings: Settings) -> dict[str, Workload]:
    return {
        "base": adds(units=0),
        "adds": adds(units=settings.units),
        "tanhs": tanhs(units=settings.units),
        "params": unused_parameters(count=settings.unused_parameters),
        "deep_narrow": deep_narrow(layers=settings.deep_layers),
        "resnet152": tiny_resnet152(depth=settings.resnet_depth),
        "gpt2_medium": tiny_gpt2_medium(layers=settings.gpt_layers),
    }


def _calibrate(workloads: dict[str, Workload], device: torch.device) -> dict[str, Any]:
    """Budgets from the planner on profiles the strategy measured: all swapped (micro), half (deep)."""
    fit, strategy = run_fit(workloads["tanhs"], accudnn(AMPLE_BUDGET), warmup=2, steps=0, device=device)
    if strategy.plan is None:
        raise RuntimeError(f"calibration fit of tanhs planned nothing ({fit.error})")
    swap_all = {
        "budget_bytes": strategy.plan.min_budget_bytes,
        "how": "the planner's smallest budget (min_budget_bytes of the plan made in a calibration fit at "
        f"{AMPLE_BUDGET}): it swaps as much as the planner can",
    }
    fit, strategy = run_fit(workloads["deep_narrow"], accudnn(AMPLE_BUDGET), warmup=2, steps=0, device=device)
    if strategy.plan is None:
        raise RuntimeError(f"calibration fit of deep_narrow planned nothing ({fit.error})")
    profile = strategy.plan.profile
    # The reserve the strategy keeps under a budget near the profile's peak (256 MiB on CUDA).
    reserve = default_reserve_bytes(profile.unconstrained_peak_bytes, device.type)
    return {
        "tanhs_swap_all": swap_all,
        "deep_narrow_half": budget_swapping_half(profile, reserve_bytes=reserve),
    }


def _variants(workloads: dict[str, Workload], budgets: dict[str, Any]) -> list[Variant]:
    """The fits of a round. The per-unit models observe every pass (``observe_every=1``): their
    figures are the cost of the hooks. The deep narrow and structured models run both as a
    user gets them (one pass in ``observe_every`` observed whole, the others hooked up to their
    last swapped save: with nothing to swap, not at all) and with every pass observed
    (``-observed``); the deep narrow model half swapped too, and half swapped with its
    LayerNorm statistics kept (``-statistics-kept``: ``min_swap_bytes`` =
    :data:`STATISTICS_KEPT_MIN_SWAP_BYTES`, at the same budget)."""
    ample, observed = accudnn(AMPLE_BUDGET), accudnn(AMPLE_BUDGET, observe_every=1)
    variants: list[Variant] = []
    for name in ("base", "adds", "tanhs", "params"):
        variants.append(Variant(f"{name}/default", workloads[name], DEFAULT_STRATEGY))
        variants.append(Variant(f"{name}/accudnn", workloads[name], observed))
    for name in ("deep_narrow", "resnet152", "gpt2_medium"):
        variants.append(Variant(f"{name}/default", workloads[name], DEFAULT_STRATEGY))
        variants.append(Variant(f"{name}/accudnn", workloads[name], ample))
        variants.append(Variant(f"{name}/accudnn-observed", workloads[name], observed))
    variants.append(
        Variant(
            "tanhs/accudnn-swapped",
            workloads["tanhs"],
            accudnn(budgets["tanhs_swap_all"]["budget_bytes"], observe_every=1),
        )
    )
    half = budgets["deep_narrow_half"]["budget_bytes"]
    variants.append(Variant("deep_narrow/accudnn-half", workloads["deep_narrow"], accudnn(half)))
    variants.append(
        Variant("deep_narrow/accudnn-half-observed", workloads["deep_narrow"], accudnn(half, observe_every=1))
    )
    variants.append(
        Variant(
            "deep_narrow/accudnn-half-statistics-kept",
            workloads["deep_narrow"],
            accudnn(half, min_swap_bytes=STATISTICS_KEPT_MIN_SWAP_BYTES),
        )
    )
    return variants


def _interleaved(
    variants: list[Variant], settings: Settings, device: torch.device
) -> dict[str, list[FitResult]]:
    """``settings.repeats`` rounds of one fit per variant, the order rotated every round."""
    fits: dict[str, list[FitResult]] = {variant.name: [] for variant in variants}
    for repeat in range(settings.repeats):
        shift = repeat * max(1, len(variants) // settings.repeats)
        for variant in variants[shift:] + variants[:shift]:
            gc.collect()
            fit, _ = run_fit(variant.workload, variant.strategy, settings.warmup, settings.steps, device)
            fits[variant.name].append(fit)
            median = fit.median_seconds
            print(
                f"bench.overhead: round {repeat + 1}/{settings.repeats} {variant.name}: "
                + (f"{median * 1e3:.1f} ms/step" if median is not None else f"failed ({fit.error})"),
                flush=True,
            )
    return fits


def _quiet() -> None:
    """Keep the raw log to what matters: no per-fit banners, no repeated CPU warning."""
    for name in ("lightning.pytorch", "lightning_accudnn", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="lightning-accudnn on CPU")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*`training_step` returned.*")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and 2 repeats: a structure check")
    parser.add_argument("--repeats", type=int, help="interleaved rounds (default 5; quick 2)")
    parser.add_argument("--steps", type=int, help="measured steps per fit (default 4; quick 2)")
    parser.add_argument("--device", default="cpu", help='"cpu" (default), "cuda" or "cuda:N"')
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", help="result file name after the date (default overhead or overhead-quick)")
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure, print and write; returns the result written."""
    settings = QUICK if args.quick else Settings()
    if args.repeats is not None:
        settings = replace(settings, repeats=args.repeats)
    if args.steps is not None:
        settings = replace(settings, steps=args.steps)
    if settings.repeats < 1 or settings.steps < 1:
        raise SystemExit("bench.overhead: --repeats and --steps must be at least 1")
    device = resolve_device(args.device)
    name = args.name or ("overhead-quick" if args.quick else "overhead")
    stem = output_stem(args.results_dir, device_slug(device), name)
    started = time.time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with raw_log(stem.with_suffix(".log")), warnings.catch_warnings():
            _quiet()
            result = _measure(settings, args, device, started)
            result["files"] = {
                "json": stem.name + ".json",
                "markdown": stem.name + ".md",
                "log": stem.name + ".log",
            }
            markdown = figures.markdown(result)
            stem.with_suffix(".md").write_text(markdown, encoding="utf-8")
            write_json(stem.with_suffix(".json"), result)
            print(markdown)
            print(f"bench.overhead: wrote {stem}.json, .md, .log")
    finally:
        torch.set_num_threads(threads)
    return result


def _measure(
    settings: Settings, args: argparse.Namespace, device: torch.device, started: float
) -> dict[str, Any]:
    env = environment(device)
    load_before = _load_average()
    print(
        f"bench.overhead: torch {env['torch']}, lightning {env['lightning']}, commit {env['git']['commit']}"
    )
    workloads = _workloads(settings)
    counts = {name: asdict(count_step(workload)) for name, workload in workloads.items()}
    print("bench.overhead: planning the real sizes for the H100 (datasheet estimates) ...", flush=True)
    projections = {
        key: predict(target)
        for key, target in zip(("resnet152", "gpt2_medium"), settings.targets, strict=True)
    }
    gc.collect()
    print("bench.overhead: the floor (bare saved_tensors_hooks pair, plain loop) ...", flush=True)
    floor = measure_floor(
        workloads["tanhs"], settings.floor_repeats, settings.warmup, settings.floor_steps, device
    )
    print("bench.overhead: the copying floor (a pair copying each saved tensor out and back) ...", flush=True)
    copy_floor = measure_floor(
        workloads["tanhs"],
        settings.floor_repeats,
        settings.warmup,
        settings.floor_steps,
        device,
        copying=True,
    )
    print("bench.overhead: calibration fits (budgets from the planner) ...", flush=True)
    budgets = _calibrate(workloads, device)
    variants = _variants(workloads, budgets)
    fits = _interleaved(variants, settings, device)
    return {
        "kind": "bench.overhead",
        "schema": 1,
        "label": QUICK_LABEL if args.quick else (CPU_LABEL if device.type == "cpu" else GPU_LABEL),
        "quick": bool(args.quick),
        "environment": env,
        "settings": {
            **{key: value for key, value in asdict(settings).items() if key != "targets"},
            "torch_threads": 1,
            "ample_budget": AMPLE_BUDGET,
            "min_swap_bytes": 0,
            "statistics_kept_min_swap_bytes": STATISTICS_KEPT_MIN_SWAP_BYTES,
            "observe_every": OffloadConfig().observe_every,
            "argv": sys.argv[1:],
        },
        "workloads": {
            name: {"params": workload.params, **counts[name]} for name, workload in workloads.items()
        },
        "budgets": budgets,
        "floor": figures.floor_dict(floor),
        "copy_floor": figures.floor_dict(copy_floor, copying=True),
        **figures.derive(fits, counts, floor, copy_floor, projections, OffloadConfig().observe_every),
        "fits": {name: [figures.fit_dict(fit) for fit in runs] for name, runs in fits.items()},
        "load_average": {"before": load_before, "after": _load_average()},
        "wall_seconds": time.time() - started,
    }


def _load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (other processes share the CPUs)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m bench.overhead``; returns the result written."""
    return run(build_parser().parse_args(argv))
