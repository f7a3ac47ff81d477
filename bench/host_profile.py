"""Where a training step's host time went, function by function, from ``cProfile``.

On a GPU whose kernels are short the step is bound by the host: the device waits while Python
issues the next kernels. ``torch.profiler``'s device view (:mod:`bench.streams`) shows that the
compute stream sat idle, not which host code kept it waiting. :func:`profile_host` runs more
steps under ``cProfile`` and returns, per step, the wall time under the profiler, the number of
calls, and the functions with the most own time (``tottime``: time in the function itself, not in
what it calls), each with its calls and its own and cumulative milliseconds. A wait for the device
(a synchronisation, a copy to the host) shows as the own time of the call that waits.

``cProfile`` costs time per Python call, so figures under it are larger than the measured steps',
most where Python is busiest: set rows against each other (a technique against no offload), not
against the measured step times.

Example:
    >>> figures = profile_host(lambda: sorted(range(1000, 0, -1)), steps=2, top=3)
    >>> figures["steps"], len(figures["functions"]) <= 3
    (2, True)
    >>> any("sorted" in function["function"] for function in figures["functions"])
    True
"""

from __future__ import annotations

import cProfile
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The functions a profile keeps, by own time.
TOP_FUNCTIONS = 25


def _function_name(key: tuple[str, int, str]) -> str:
    """``file.py:line(name)``, or the builtin's own name (``cProfile`` files those under ``~``)."""
    filename, line, name = key
    if filename == "~":
        return name
    return f"{Path(filename).name}:{line}({name})"


def profile_host(run: Callable[[], object], steps: int = 2, top: int = TOP_FUNCTIONS) -> dict[str, Any]:
    """Call ``run`` (one training step) ``steps`` times under ``cProfile``: per step, the wall
    seconds under the profiler, the calls, and the ``top`` functions by own time."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    profiler = cProfile.Profile()
    started = time.perf_counter()
    for _ in range(steps):
        profiler.enable()
        try:
            run()
        finally:
            profiler.disable()
    wall = time.perf_counter() - started
    table = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
    functions = [
        {
            "function": _function_name(key),
            "calls_per_step": calls / steps,
            "own_ms_per_step": own * 1e3 / steps,
            "cumulative_ms_per_step": cumulative * 1e3 / steps,
        }
        for key, (_, calls, own, cumulative, _) in rows[:top]
    ]
    return {
        "steps": steps,
        "wall_seconds_per_step": wall / steps,
        "calls_per_step": sum(entry[1] for entry in table.values()) / steps,
        "functions": functions,
    }


def host_line(name: str, figures: dict[str, Any] | None, shown: int = 4) -> list[str]:
    """A Markdown list item naming a row's host time under ``cProfile`` and the ``shown``
    functions with the most own time (none without figures).

    Example:
        >>> figures = {"wall_seconds_per_step": 0.25, "calls_per_step": 51000.0, "functions": [
        ...     {"function": "engine.py:10(pack)", "calls_per_step": 900.0, "own_ms_per_step": 12.5,
        ...      "cumulative_ms_per_step": 30.0}]}
        >>> print(host_line("accudnn-2x", figures)[0])
        - accudnn-2x: 250.0 ms a step under cProfile, 51,000 calls; most own time: engine.py:10(pack) \
12.5 ms (900 calls, 30.0 ms with what it calls)
    """
    if not figures:
        return []
    most = ", ".join(
        f"{entry['function']} {entry['own_ms_per_step']:.1f} ms ({entry['calls_per_step']:,.0f} calls, "
        f"{entry['cumulative_ms_per_step']:.1f} ms with what it calls)"
        for entry in figures["functions"][:shown]
    )
    return [
        f"- {name}: {figures['wall_seconds_per_step'] * 1e3:.1f} ms a step under cProfile, "
        f"{figures['calls_per_step']:,.0f} calls; most own time: {most}"
    ]
