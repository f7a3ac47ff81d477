"""The search as a table (printed at rank zero) and as an optional PNG of throughput vs batch size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lightning_accudnn.callbacks.batch_search import SearchResult
from lightning_accudnn.planner import format_bytes

__all__ = ["format_search_table", "require_matplotlib", "save_throughput_plot"]

MATPLOTLIB_HINT = "pip install matplotlib (or: pip install 'lightning-accudnn[plot]')"


def format_search_table(result: SearchResult, world_size: int = 1) -> str:
    """One line per batch size measured or predicted: throughput, peaks, and the choice.

    Example:
        >>> from lightning_accudnn.callbacks.batch_search import Trial, search_batch_size
        >>> result = search_batch_size([8, 16], lambda b: Trial(b, 10.0 * b, peak_bytes=b * 10**6))
        >>> print(format_search_table(result))  # doctest: +NORMALIZE_WHITESPACE
        batch  samples/s  predicted samples/s  predicted peak  measured peak  result
            8       80.0                    -               -        8.00 MB
           16      160.0                    -               -       16.00 MB  chosen
        chosen batch size 16 (tolerance 5%: the smallest within 5% of the best measured throughput);
        stopped: no candidates left
    """
    measured = {t.batch_size: t for t in result.trials}
    sizes = sorted(set(measured) | set(result.predictions))
    header = ("batch", "samples/s", "predicted samples/s", "predicted peak", "measured peak", "result")
    rows = [header]
    for size in sizes:
        trial = measured.get(size)
        prediction = result.predictions.get(size)
        if trial is None:
            outcome = (
                "not run" if prediction is None or prediction.feasible else f"infeasible: {prediction.reason}"
            )
        elif not trial.ok:
            outcome = f"failed: {trial.failure}"
        else:
            outcome = "chosen" if size == result.chosen else ""
        rows.append(
            (
                str(size),
                _number(trial.samples_per_second if trial is not None else None),
                _number(prediction.samples_per_second if prediction is not None else None),
                _bytes(prediction.peak_bytes if prediction is not None else None),
                _bytes(trial.peak_bytes if trial is not None else None),
                outcome,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    ]
    percent = f"{result.tolerance * 100:g}%"
    per_device = f"; samples/s per device, slowest of {world_size} ranks" if world_size > 1 else ""
    lines.append(
        f"chosen batch size {result.chosen} (tolerance {percent}: the smallest within {percent} of the best "
        f"measured throughput{per_device});"
    )
    lines.append(f"stopped: {result.stopped_because}")
    return "\n".join(line.rstrip() for line in lines)


def require_matplotlib() -> None:
    """Raise ``ModuleNotFoundError`` naming the fix when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ModuleNotFoundError(
            f"EfficiencyTuner(plot_path=...) draws with matplotlib, which is missing: {MATPLOTLIB_HINT}"
        )


def save_throughput_plot(result: SearchResult, path: str | Path) -> Path:
    """Measured (and predicted) samples per second against the batch size, the choice marked.

    Example:
        >>> save_throughput_plot(result, "throughput.png")  # doctest: +SKIP
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(7, 4))
    ok = sorted(
        (t.batch_size, t.samples_per_second)
        for t in result.trials
        if t.samples_per_second is not None and t.ok
    )
    axes.plot([b for b, _ in ok], [r for _, r in ok], "o-", label="measured")
    predicted = sorted(
        (b, p.samples_per_second) for b, p in result.predictions.items() if p.samples_per_second is not None
    )
    if predicted:
        axes.plot([b for b, _ in predicted], [r for _, r in predicted], "x--", label="predicted")
    failed = [t.batch_size for t in result.trials if not t.ok]
    for size in failed:
        axes.axvline(size, color="red", linestyle=":", label="failed" if size == failed[0] else None)
    best = result.best.samples_per_second or 0.0
    share = f"{(1 - result.tolerance) * 100:g}% of the best"
    axes.axhline(best * (1 - result.tolerance), color="gray", linestyle=":", label=share)
    chosen = result.chosen_trial
    axes.plot([chosen.batch_size], [chosen.samples_per_second or 0.0], "*", markersize=16, label="chosen")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("batch size per device")
    axes.set_ylabel("samples / s")
    axes.set_title("EfficiencyTuner")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)
