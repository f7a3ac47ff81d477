"""Writing results: where they go, the JSON, the markdown table, the PNG plot, the raw log.

Every figure written here comes from a row the harness measured in the same process; a
row that failed has its status and error and no figures.

Example:
    >>> fmt_bytes(1_500_000_000), fmt_bytes(None)
    ('1.50 GB', '-')
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import torch

from bench.environment import device_slug, environment
from lightning_accudnn.planner import format_bytes

log = logging.getLogger("bench")


# -- paths ------------------------------------------------------------------------------------


def output_stem(results_dir: Path, device_slug: str, name: str, date: datetime.date | None = None) -> Path:
    """``<results_dir>/<device_slug>/<date>-<name>``, with ``-2``, ``-3``... if already taken
    (a ``name`` that starts with the date already is not given it twice).

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> output_stem(root, "cpu", "tiny", datetime.date(2025, 1, 2)).name
        '2025-01-02-tiny'
        >>> output_stem(root, "cpu", "2025-01-02-tiny", datetime.date(2025, 1, 2)).name
        '2025-01-02-tiny'
    """
    day = (date or datetime.datetime.now(datetime.timezone.utc).date()).isoformat()
    folder = results_dir / device_slug
    folder.mkdir(parents=True, exist_ok=True)
    name = name.removeprefix(f"{day}-")
    stem = folder / f"{day}-{name}"
    counter = 2
    while any(stem.with_name(stem.name + suffix).exists() for suffix in (".json", ".log")):
        stem = folder / f"{day}-{name}-{counter}"
        counter += 1
    return stem


# -- the raw log --------------------------------------------------------------------------------


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def raw_log(path: Path) -> Iterator[None]:
    """Copy everything printed and logged (Lightning's and lightning-accudnn's messages,
    warnings) into ``path`` while still printing it.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "run.log"
        >>> with raw_log(path):
        ...     print("hello")
        hello
        >>> path.read_text()
        'hello\\n'
    """
    with open(path, "w", encoding="utf-8") as file:
        old_out, old_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(old_out, file), _Tee(old_err, file)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        loggers = [logging.getLogger(name) for name in ("bench", "lightning_accudnn", "lightning.pytorch")]
        saved = [(logger, logger.level, logger.propagate, list(logger.handlers)) for logger in loggers]
        for logger in loggers:
            logger.handlers = [handler]
            logger.setLevel(logging.INFO)
            logger.propagate = False
        warnings_logger = logging.getLogger("py.warnings")
        warnings_handlers = list(warnings_logger.handlers)
        warnings_logger.handlers = [handler]
        logging.captureWarnings(True)
        try:
            yield
        finally:
            logging.captureWarnings(False)
            warnings_logger.handlers = warnings_handlers
            for logger, level, propagate, handlers in saved:
                logger.handlers, logger.propagate = handlers, propagate
                logger.setLevel(level)
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = old_out, old_err


# -- JSON -------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become ``None``, tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON (``NaN`` and infinities as ``null``)."""
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n", encoding="utf-8")


def write_result(
    results_dir: Path, device: torch.device, name: str, record: dict[str, Any], markdown: str | None = None
) -> Path:
    """Write ``record``, with the :func:`~bench.environment.environment` of ``device`` it was
    measured on, as ``<results_dir>/<device slug>/<date>-<name>.json`` (:func:`output_stem`,
    :func:`write_json`), and ``markdown``, when given, beside it as ``.md``; print where, and
    return the JSON's path.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> path = write_result(root, torch.device("cpu"), "demo", {"kind": "demo"})  # doctest: +ELLIPSIS
        wrote .../cpu/...-demo.json
        >>> written = json.loads(path.read_text())
        >>> written["kind"], written["environment"]["device"]
        ('demo', 'cpu')
    """
    path = output_stem(results_dir, device_slug(device), name).with_suffix(".json")
    write_json(path, {**record, "environment": environment(device)})
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown, encoding="utf-8")
    print(f"wrote {path}")
    return path


# -- markdown ---------------------------------------------------------------------------------


def fmt_bytes(value: int | float | None) -> str:
    return "-" if value is None else format_bytes(value)


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def fmt_ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


_PEAK_WORDS = {
    "cuda_allocator": "CUDA allocator",
    "engine_ledger": "engine ledger",
    "process_rss_delta": "RSS delta",
}


def _status_text(row: dict[str, Any]) -> str:
    if row["status"] == "ok":
        return "ok"
    error = (row.get("error") or "").replace("|", "/")
    if len(error) > 90:
        error = error[:87] + "..."
    return f"{row['status']}: {row.get('error_type') or ''} {error}".strip()


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per strategy row; columns as in ``bench/README.md``.

    Example:
        >>> row = {"name": "torchtune", "status": "not_installed", "error_type": "ImportError",
        ...        "error": "no torchtune"}
        >>> print(markdown_table([row]).splitlines()[2][:50])
        | torchtune | not_installed: ImportError no torcht
    """
    header = (
        "| strategy | status | budget | peak | peak source | reserved | ledger | vs oracle "
        "| step ms | fwd+bwd ms | host ms | engine host ms "
        "| samples/s | swapped out/step | LB ms | bound ratio | predicted peak | predicted ms "
        "| peak/pred | time/pred |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        get = row.get
        lines.append(
            "| "
            + " | ".join(
                [
                    str(get("name")),
                    _status_text(row),
                    fmt_bytes(get("budget_bytes")),
                    fmt_bytes(get("peak_allocated_bytes")),
                    _PEAK_WORDS.get(get("peak_source") or "", "-")
                    if get("peak_allocated_bytes") is not None
                    else "-",
                    fmt_bytes(get("peak_reserved_bytes")),
                    fmt_bytes(get("ledger_peak_bytes")),
                    "-" if get("peak_reduction") is None else f"{get('peak_reduction'):.2f}x",
                    fmt_ms(get("median_step_seconds")),
                    fmt_ms(get("median_fwd_bwd_seconds")),
                    fmt_ms(get("median_fwd_bwd_issue_seconds")),
                    fmt_ms(get("engine_host_seconds")),
                    fmt_ratio(get("samples_per_second"), 1),
                    fmt_bytes(get("bytes_swapped_out")),
                    fmt_ms(get("lower_bound_seconds")),
                    fmt_ratio(get("bound_ratio")),
                    fmt_bytes(get("predicted_peak_bytes")),
                    fmt_ms(get("predicted_step_seconds")),
                    fmt_ratio(get("peak_vs_predicted")),
                    fmt_ratio(get("time_vs_predicted")),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


# -- PNG --------------------------------------------------------------------------------------


def matplotlib_or_reason() -> tuple[Any, str | None]:
    """``(pyplot, None)``, or ``(None, why not)`` when matplotlib cannot be used."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install matplotlib); no PNG written"
    return plt, None


_SOURCE_COLORS = {"cuda_allocator": "#4C72B0", "engine_ledger": "#55A868", "process_rss_delta": "#8172B2"}


def plotted_peak(row: dict[str, Any]) -> tuple[int | None, str | None]:
    """The peak a plot shows for a row and its source: the CUDA allocator's, else the engine
    ledger's when the row has one (the oracle's untimed probe, AccUDNN), else the RSS delta.

    Example:
        >>> row = {"peak_source": "process_rss_delta", "peak_allocated_bytes": 9, "ledger_peak_bytes": 5}
        >>> plotted_peak(row)
        (5, 'engine_ledger')
    """
    if row.get("peak_source") != "cuda_allocator" and row.get("ledger_peak_bytes"):
        return row["ledger_peak_bytes"], "engine_ledger"
    return row.get("peak_allocated_bytes"), row.get("peak_source")


def plot_rows(path: Path, rows: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """Bar charts of peak memory and samples/s per row; what happened, for the JSON.

    Bars are coloured by how the peak was measured (peaks of different colours do not
    compare); a red tick marks an AccUDNN row's budget. Rows that did not run to the end
    show as an empty slot labelled with their status. Returns ``{"written": True, "path":
    ...}`` or ``{"written": False, "reason": ...}``.
    """
    plt, reason = matplotlib_or_reason()
    if plt is None:
        return {"written": False, "reason": reason}
    names = [row["name"] for row in rows]
    peaks = [plotted_peak(row) for row in rows]
    speeds = [row.get("samples_per_second") or 0.0 for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(max(9.0, 0.9 * len(rows) * 2), 4.8))
    positions = range(len(rows))
    colors = [_SOURCE_COLORS.get(source or "", "#999999") for _, source in peaks]
    largest = max([value or 0 for value, _ in peaks] + [row.get("budget_bytes") or 0 for row in rows])
    unit, scale = ("GB", 1e9) if largest >= 1e9 else ("MB", 1e6)
    left.bar(positions, [(value or 0) / scale for value, _ in peaks], color=colors)
    for index, row in enumerate(rows):
        if row.get("strategy") == "accudnn" and row.get("budget_bytes"):
            left.hlines(row["budget_bytes"] / scale, index - 0.4, index + 0.4, colors="#C44E52", linewidth=2)
    right.bar(positions, speeds, color="#4C72B0")
    for axis in (left, right):
        axis.set_xticks(list(positions), names, rotation=45, ha="right", fontsize=8)
        for index, row in enumerate(rows):
            if row["status"] != "ok":
                axis.annotate(
                    row["status"],
                    (index, 0),
                    ha="center",
                    va="bottom",
                    rotation=90,
                    fontsize=7,
                    xytext=(0, 3),
                    textcoords="offset points",
                    color="#C44E52",
                )
    used = [source for source in _SOURCE_COLORS if any(s == source for _, s in peaks)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=_SOURCE_COLORS[s]) for s in used]
    labels = [_PEAK_WORDS[s] for s in used]
    handles.append(plt.Line2D([0], [0], color="#C44E52", linewidth=2))
    labels.append("AccUDNN budget")
    left.legend(handles, labels, fontsize=7)
    left.set_ylabel(f"peak memory ({unit})")
    left.set_title("peak per step (colours do not compare)", fontsize=9)
    right.set_ylabel("samples / s")
    right.set_title("median step after warm-up", fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return {"written": True, "path": path.name}


def describe(params: dict[str, Any]) -> str:
    """Compact ``key=value`` text of a workload's parameters.

    Example:
        >>> describe({"depth": 26, "batch_size": 16})
        'depth=26, batch_size=16'
    """
    return ", ".join(f"{key}={value}" for key, value in params.items())
