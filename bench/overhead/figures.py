"""From timed fits to the benchmark's figures, and the markdown summary.

Every figure is computed per interleaved round from the fits of that round (the strategy's
step less the default strategy's step of the same workload, both measured in the round),
then summarised over the rounds as a :class:`~bench.overhead.spread.Spread`:

* per module call: (added time of ``adds`` - added time of ``base``) / module calls between them;
* per kept saved tensor: (added time of ``tanhs`` - of ``adds``) / saved tensors between them
  (the same module calls, one more saved tensor per module), less the floor's median;
* per swapped saved tensor: the kept figure plus (added time of ``tanhs`` swapped - of
  ``tanhs`` kept) / swapped tensors per step (from the strategy's swapped bytes), less the floor;
* per parameter: (added time of ``params`` - of ``base``) / parameters between them;
* per swapped storage of the deep narrow model: (its half-swapped step - its step with
  nothing swapped, both with every pass observed) / storages swapped per step, beside what
  that figure may be for the half-swapped step to stay within :data:`HALF_SWAPPED_TARGET` of
  the default strategy's;
* the half-swapped ratios, like those with nothing swapped, for the typical step (its hooks
  go after its last swapped save), with every pass observed, and amortised over
  ``observe_every`` steps (one observed).

Example:
    >>> fit = FitResult(step_seconds=[0.002, 0.003], full_collections=1)
    >>> fit_dict(fit)["median_seconds"], collections_per_100_steps([fit, fit])
    (0.0025, 50.0)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from bench.overhead.fits import FitResult
from bench.overhead.floor import Floor
from bench.overhead.spread import Spread

Fits = dict[str, list[FitResult]]

#: The step ratio against the default strategy asked of the deep narrow model half swapped.
HALF_SWAPPED_TARGET = 1.6


def fit_dict(fit: FitResult) -> dict[str, Any]:
    return {"median_seconds": fit.median_seconds, **asdict(fit)}


def floor_dict(floor: Floor, copying: bool = False) -> dict[str, Any]:
    pair = (
        "a saved_tensors_hooks pair copying each saved tensor into a new host tensor and back into a new "
        "device tensor"
        if copying
        else "a bare saved_tensors_hooks identity pair"
    )
    return {
        "what": f"{pair} around forward, plain PyTorch loop, same model as 'tanhs': (hooked step - plain "
        "step) / saved tensors",
        "saved_tensors": floor.saved_tensors,
        "us_per_saved_tensor": floor.per_saved_tensor_seconds.scaled(1e6).as_dict(),
        "plain_step_ms": floor.plain_step_seconds.scaled(1e3).as_dict(),
        "hooked_step_ms": floor.hooked_step_seconds.scaled(1e3).as_dict(),
    }


def collections_per_100_steps(fits: list[FitResult]) -> float | None:
    steps = sum(len(fit.step_seconds) for fit in fits)
    return 100.0 * sum(fit.full_collections for fit in fits) / steps if steps else None


def _per_round(fits: Fits, *names: str) -> list[list[FitResult]]:
    """The fits of ``names`` round by round (one list per round)."""
    return [list(round_fits) for round_fits in zip(*(fits[name] for name in names), strict=True)]


def _added(fits: Fits, workload: str, variant: str = "accudnn") -> list[float | None]:
    """Per round: the strategy's median step less the default strategy's, same workload."""
    added: list[float | None] = []
    for default, strategy in _per_round(fits, f"{workload}/default", f"{workload}/{variant}"):
        if default.median_seconds is None or strategy.median_seconds is None:
            added.append(None)
        else:
            added.append(strategy.median_seconds - default.median_seconds)
    return added


def _combine(function: Callable[..., float | None], *series: list[Any]) -> list[float | None]:
    return [
        None if any(value is None for value in values) else function(*values)
        for values in zip(*series, strict=True)
    ]


def _spread_dict(values: list[float | None], factor: float = 1.0) -> dict[str, Any] | None:
    spread = Spread.of(values)
    return spread.scaled(factor).as_dict() if spread is not None else None


def derive(
    fits: Fits,
    counts: dict[str, dict[str, int]],
    floor: Floor,
    copy_floor: Floor,
    projections: dict[str, dict[str, Any]],
    observe_every: int,
) -> dict[str, Any]:
    """The per-unit costs, the deep narrow ratios, the structured models' added time and shares.

    ``observe_every`` is the strategy's default: the amortised figures weigh the typical step
    (a plan that keeps everything, unobserved) and the observed one in that proportion."""
    floor_seconds = floor.per_saved_tensor_seconds.median
    added = {name: _added(fits, name) for name in ("base", "adds", "tanhs", "params")}
    added_swapped = _added(fits, "tanhs", "accudnn-swapped")
    calls = counts["adds"]["module_calls"] - counts["base"]["module_calls"]
    kept_tensors = counts["tanhs"]["saved_tensors"] - counts["adds"]["saved_tensors"]
    parameters = counts["params"]["parameters"] - counts["base"]["parameters"]
    per_call = _combine(lambda a, b: (a - b) / calls, added["adds"], added["base"])
    per_kept = _combine(lambda a, b: (a - b) / kept_tensors, added["tanhs"], added["adds"])
    swapped_tensors = [_swapped_tensors(fit) for fit in fits["tanhs/accudnn-swapped"]]
    per_swapped = _combine(
        lambda kept, swap, keep, n: kept + (swap - keep) / n if n else None,
        per_kept,
        added_swapped,
        added["tanhs"],
        swapped_tensors,
    )
    per_parameter = _combine(lambda a, b: (a - b) / parameters, added["params"], added["base"])
    per_unit = {
        "module_call_us": _spread_dict(per_call, 1e6),
        "kept_saved_tensor_us_above_floor": _spread_dict(_minus(per_kept, floor_seconds), 1e6),
        "swapped_saved_tensor_us_above_floor": _spread_dict(_minus(per_swapped, floor_seconds), 1e6),
        "swapped_saved_tensor_us_above_copy_floor": _spread_dict(
            _minus(per_swapped, copy_floor.per_saved_tensor_seconds.median), 1e6
        ),
        "parameter_us": _spread_dict(per_parameter, 1e6),
        "kept_saved_tensor_us_total": _spread_dict(per_kept, 1e6),
        "swapped_saved_tensor_us_total": _spread_dict(per_swapped, 1e6),
        "floor_us_per_saved_tensor": floor_seconds * 1e6,
        "units": {
            "module_calls": calls,
            "kept_saved_tensors": kept_tensors,
            "swapped_saved_tensors_per_step": _spread_dict(swapped_tensors),
            "parameters": parameters,
        },
    }
    return {
        "per_unit": per_unit,
        "full_collections_per_100_steps": {
            name: collections_per_100_steps(runs) for name, runs in fits.items()
        },
        "measured_steps_per_variant": {
            name: sum(len(f.step_seconds) for f in runs) for name, runs in fits.items()
        },
        "deep_narrow": _deep_narrow(fits, observe_every),
        "structured": {
            name: _structured(
                fits, name, counts[name], projections[name], per_call, per_kept, per_parameter, observe_every
            )
            for name in ("resnet152", "gpt2_medium")
        },
    }


def _minus(values: list[float | None], constant: float) -> list[float | None]:
    return [None if value is None else value - constant for value in values]


def _swapped_tensors(fit: FitResult) -> float | None:
    """Saved tensors swapped per step in the ``tanhs`` model: swapped bytes over one tensor's bytes."""
    if fit.swapped_bytes_per_step is None or fit.plan is None:
        return None
    layers = fit.plan["layers"]  # one saved tensor per layer, all of one size
    return fit.swapped_bytes_per_step / (fit.plan["saved_bytes"] / layers) if layers else None


def _median_step(fit: FitResult) -> float | None:
    return fit.median_seconds


def _mean_step(fit: FitResult) -> float | None:
    """A step that ran a full garbage collection counts here, where the median leaves it out."""
    return statistics.fmean(fit.step_seconds) if fit.step_seconds else None


def _ratio(
    fits: Fits, variant: str, step: Callable[[FitResult], float | None] = _median_step
) -> list[float | None]:
    """Per round: the strategy's ``step`` time over the default strategy's, deep narrow model."""
    ratios: list[float | None] = []
    for default, strategy in _per_round(fits, "deep_narrow/default", f"deep_narrow/{variant}"):
        base, value = step(default), step(strategy)
        ratios.append(value / base if base and value is not None else None)
    return ratios


def _amortised(typical: list[float | None], observed: list[float | None], every: int) -> list[float | None]:
    """Per round: ``every - 1`` typical (unobserved) steps and one observed step, averaged."""
    return _combine(lambda a, b: ((every - 1) * a + b) / every, typical, observed)


def _swapped_fractions(fits: list[FitResult]) -> list[float | None]:
    """Per fit: the share of the plan's swappable bytes that the strategy swapped per step."""
    return [
        fit.swapped_bytes_per_step / fit.plan["swappable_bytes"]
        if fit.swapped_bytes_per_step is not None and fit.plan and fit.plan["swappable_bytes"]
        else None
        for fit in fits
    ]


def _deep_narrow(fits: Fits, observe_every: int) -> dict[str, Any]:
    typical, observed = _ratio(fits, "accudnn"), _ratio(fits, "accudnn-observed")
    half, half_observed = _ratio(fits, "accudnn-half"), _ratio(fits, "accudnn-half-observed")
    rounds = _per_round(
        fits, "deep_narrow/default", "deep_narrow/accudnn-observed", "deep_narrow/accudnn-half-observed"
    )
    storages = [half.swapped_storages_per_step for _, _, half in rounds]
    steps = [[fit.median_seconds for fit in fits_of_round] for fits_of_round in rounds]
    per_swap = _combine(lambda steps, n: (steps[2] - steps[1]) / n if n else None, steps, storages)
    at_target = _combine(
        lambda steps, n: (HALF_SWAPPED_TARGET * steps[0] - steps[1]) / n if n else None, steps, storages
    )
    kept_statistics = fits["deep_narrow/accudnn-half-statistics-kept"]
    return {
        "ratio_nothing_swapped": _spread_dict(typical),
        "ratio_nothing_swapped_observed": _spread_dict(observed),
        "ratio_nothing_swapped_amortised": _spread_dict(_amortised(typical, observed, observe_every)),
        "ratio_half_swapped": _spread_dict(half),
        "ratio_half_swapped_observed": _spread_dict(half_observed),
        "ratio_half_swapped_amortised": _spread_dict(_amortised(half, half_observed, observe_every)),
        "ratio_half_swapped_mean": _spread_dict(_ratio(fits, "accudnn-half", _mean_step)),
        "measured_swapped_fraction": _spread_dict(_swapped_fractions(fits["deep_narrow/accudnn-half"])),
        "swapped_storages_per_step": _spread_dict(list(storages)),
        "swap_us_above_observed_step": _spread_dict(per_swap, 1e6),
        "swap_us_above_observed_step_at_target": _spread_dict(at_target, 1e6),
        "statistics_kept": {
            "ratio_half_swapped": _spread_dict(_ratio(fits, "accudnn-half-statistics-kept")),
            "measured_swapped_fraction": _spread_dict(_swapped_fractions(kept_statistics)),
            "swapped_storages_per_step": _spread_dict(
                [fit.swapped_storages_per_step for fit in kept_statistics]
            ),
        },
        "step_ms": {
            variant: _spread_dict([fit.median_seconds for fit in fits[f"deep_narrow/{variant}"]], 1e3)
            for variant in (
                "default",
                "accudnn",
                "accudnn-observed",
                "accudnn-half",
                "accudnn-half-observed",
                "accudnn-half-statistics-kept",
            )
        },
        "errors": sorted(
            {fit.error for name in fits if name.startswith("deep_narrow/") for fit in fits[name] if fit.error}
        ),
    }


def _structured(
    fits: Fits,
    name: str,
    counts: dict[str, int],
    projection: dict[str, Any],
    per_call: list[float | None],
    per_kept: list[float | None],
    per_parameter: list[float | None],
    observe_every: int,
) -> dict[str, Any]:
    typical, observed = _added(fits, name), _added(fits, name, "accudnn-observed")
    added = _amortised(typical, observed, observe_every)
    h100 = projection["predicted_step_seconds"]
    from_units = _combine(
        lambda call, kept, parameter: (
            counts["module_calls"] * call + counts["saved_tensors"] * kept + counts["parameters"] * parameter
        ),
        per_call,
        per_kept,
        per_parameter,
    )
    return {
        "host_ms_added": _spread_dict(added, 1e3),
        "host_ms_added_typical": _spread_dict(typical, 1e3),
        "host_ms_added_observed": _spread_dict(observed, 1e3),
        "share_of_h100_step": _spread_dict(_combine(lambda a: a / h100, added)),
        "share_of_h100_step_observed": _spread_dict(_combine(lambda a: a / h100, observed)),
        "h100": projection,
        "step_ms": {
            variant: _spread_dict([fit.median_seconds for fit in fits[f"{name}/{variant}"]], 1e3)
            for variant in ("default", "accudnn", "accudnn-observed")
        },
        "host_ms_from_unit_costs": _spread_dict(from_units, 1e3),
        "errors": sorted(
            {fit.error for key in fits if key.startswith(f"{name}/") for fit in fits[key] if fit.error}
        ),
    }


# -- markdown -----------------------------------------------------------------------------------


def _text(spread: dict[str, Any] | None, digits: int = 2, unit: str = "") -> str:
    if spread is None:
        return "-"
    return Spread(spread["median"], spread["low"], spread["high"], spread["n"]).text(digits, unit)


def markdown(result: dict[str, Any]) -> str:
    """The summary table of a result (what ``python -m bench.overhead`` prints)."""
    env = result["environment"]
    git = env["git"]
    unit = result["per_unit"]
    deep = result["deep_narrow"]
    kept = deep["statistics_kept"]
    settings = result["settings"]
    every = settings["observe_every"]
    lines = [
        f"# Host overhead of the AccUDNN strategy on {env['cpu']} ({env['date_utc'][:10]})",
        "",
        f"**{result['label']}**",
        "",
        f"- machine: {env['platform']}, {env['cpu_count']} CPUs; torch {env['torch']}, lightning "
        f"{env['lightning']}, Python {env['python']}",
        f"- commit: {git['commit']}"
        + (f" (working tree differs: {', '.join(git['dirty_paths'])})" if git["dirty"] else " (clean)"),
        f"- {settings['repeats']} interleaved rounds of {settings['warmup']} warm-up + {settings['steps']} "
        f"measured steps per fit; min_swap_bytes 0 (but where said); ample budget {settings['ample_budget']}",
        f"- load average (1, 5, 15 min) before {result['load_average']['before']}, after "
        f"{result['load_average']['after']}: other processes share the CPUs, absolute times scale with it, "
        "ratios much less",
        "",
        "Figures: median [lowest, highest] over the rounds.",
        "",
        "| figure | value |",
        "| --- | --- |",
        "| floor: bare saved_tensors_hooks pair, µs per saved tensor | "
        f"{_text(result['floor']['us_per_saved_tensor'])} |",
        f"| µs per module call (every pass observed) | {_text(unit['module_call_us'])} |",
        "| µs per kept saved tensor above the floor (every pass observed: the hook path) | "
        f"{_text(unit['kept_saved_tensor_us_above_floor'])} |",
        "| µs per swapped saved tensor above the floor | "
        f"{_text(unit['swapped_saved_tensor_us_above_floor'])} |",
        "| copying floor: a hook pair copying each saved tensor to a new host tensor and back (four tensor "
        "operations, no bookkeeping), µs per saved tensor | "
        f"{_text(result['copy_floor']['us_per_saved_tensor'])} |",
        "| µs per swapped saved tensor above the copying floor (the engine's own cost of a swap) | "
        f"{_text(unit['swapped_saved_tensor_us_above_copy_floor'])} |",
        f"| µs per parameter per step (every pass observed) | {_text(unit['parameter_us'])} |",
        f"| deep narrow ({result['workloads']['deep_narrow']['params']['layers']} x Linear/LayerNorm/ReLU, "
        f"batch 4): step vs default strategy, nothing swapped, typical (unobserved) step | "
        f"{_text(deep['ratio_nothing_swapped'])}x |",
        "| deep narrow: nothing swapped, every pass observed (`observe_every=1`) | "
        f"{_text(deep['ratio_nothing_swapped_observed'])}x |",
        f"| deep narrow: nothing swapped, amortised over {every} steps (one observed) | "
        f"{_text(deep['ratio_nothing_swapped_amortised'])}x |",
        f"| deep narrow: step vs default strategy, about half swapped (measured "
        f"{_text(deep['measured_swapped_fraction'])}), typical step (hooked up to its last swapped save) | "
        f"{_text(deep['ratio_half_swapped'])}x |",
        "| deep narrow: half swapped, every pass observed (`observe_every=1`) | "
        f"{_text(deep['ratio_half_swapped_observed'])}x |",
        f"| deep narrow: half swapped, amortised over {every} steps (one observed) | "
        f"{_text(deep['ratio_half_swapped_amortised'])}x |",
        "| deep narrow: half swapped, typical, mean step over the default strategy's (the steps that ran a "
        f"full garbage collection counted) | {_text(deep['ratio_half_swapped_mean'])}x |",
        f"| deep narrow, half swapped ({_text(deep['swapped_storages_per_step'], 0)} storages per step), "
        "every pass observed: µs per swapped storage above the step observed with nothing swapped; what it "
        f"may be for that step to stay within {HALF_SWAPPED_TARGET}x of the default strategy's | "
        f"{_text(deep['swap_us_above_observed_step'])}; "
        f"{_text(deep['swap_us_above_observed_step_at_target'])} |",
        f"| deep narrow: half swapped with its LayerNorm statistics kept (min_swap_bytes "
        f"{settings['statistics_kept_min_swap_bytes']}, same budget; measured "
        f"{_text(kept['measured_swapped_fraction'])} swapped, {_text(kept['swapped_storages_per_step'], 0)} "
        f"storages per step), typical step | {_text(kept['ratio_half_swapped'])}x |",
    ]
    for name, title in (("resnet152", "ResNet-152"), ("gpt2_medium", "GPT-2 medium")):
        item = result["structured"][name]
        h100 = item["h100"]
        lines += [
            f"| {title}-structured (tiny): host ms added per step, amortised over {every} steps "
            f"(typical {_text(item['host_ms_added_typical'])}, "
            f"observed {_text(item['host_ms_added_observed'])}) "
            f"| {_text(item['host_ms_added'])} |",
            f"| ... as a share of the planner's H100 step for {h100['target']} "
            f"({h100['predicted_step_seconds'] * 1e3:.3g} ms, datasheet estimate): amortised; every pass "
            f"observed {_text(item['share_of_h100_step_observed'], 2)} | "
            f"{_text(item['share_of_h100_step'], 2)} |",
        ]
    collections = result["full_collections_per_100_steps"]
    lines += [
        "",
        "Full (generation 2) garbage collections per 100 measured steps:",
        "",
        "| workload | default strategy | AccUDNN | AccUDNN, swapping |",
        "| --- | --- | --- | --- |",
    ]
    swapping = {"tanhs": "tanhs/accudnn-swapped", "deep_narrow": "deep_narrow/accudnn-half"}
    for name in ("tanhs", "deep_narrow", "resnet152", "gpt2_medium"):
        swapped = _number(collections.get(swapping[name])) if name in swapping else "-"
        lines.append(
            f"| {name} | {_number(collections.get(f'{name}/default'))} | "
            f"{_number(collections.get(f'{name}/accudnn'))} | {swapped} |"
        )
    lines += [
        "",
        f"Budgets: swapped micro model {result['budgets']['tanhs_swap_all']['budget_bytes']} B "
        f"({result['budgets']['tanhs_swap_all']['how']}); deep narrow half "
        f"{result['budgets']['deep_narrow_half']['budget_bytes']} B (planned share "
        f"{result['budgets']['deep_narrow_half']['planned_swapped_fraction']:.2f}: "
        f"{result['budgets']['deep_narrow_half']['how']}).",
        "",
        f"Raw log: {result['files']['log']}. How each figure is obtained: bench/README.md (Host overhead).",
        "",
    ]
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
