"""Python bytecodes the engine runs per swapped storage: the hot path measured without a clock.

Wall-clock figures of the host overhead carry the machine's noise; the number of bytecodes
Python executes for a pass does not depend on the machine. This counts them (``sys.settrace``
with opcode events) for one pass of the deep narrow model through :class:`OffloadEngine`
replayed by ordinal with half its saving layers swapped, and for the same pass with nothing
swapped, each on an engine whose route is compiled already (the steady state), and reports
the difference per swapped storage with the functions it is spent in. The engine alone: no
Lightning, so only the engine's own code differs between the two passes. It counts the
half-swapped pass twice: with a wide prefetch window (every swapped storage copied in as one group
at the start of backward: the figure this benchmark has reported since it was written) and with a
window of one layer (``tight_window``), what the planner chooses for this model at
``bench.overhead``'s half budget, where each storage comes back in a prefetch round of its own.

Usage::

    python -m bench.overhead.bytecodes [--layers 333] [--results-dir bench/results] [--name bytecodes]

Example:
    >>> counts = count_bytecodes(layers=4)
    >>> counts["swapped_storages"] > 0 and counts["per_swapped_storage"] > 0
    True
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from bench.overhead.engine_passes import EnginePasses
from bench.report import write_result


def count_opcodes(run: Callable[[], Any]) -> tuple[collections.Counter[str], Any]:
    """The bytecodes ``run()`` executes, by ``file:function``, and what it returned.

    Example:
        >>> counts, value = count_opcodes(lambda: sum(range(3)))
        >>> value, sum(counts.values()) > 0
        (3, True)
    """
    counts: collections.Counter[str] = collections.Counter()

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        return trace

    sys.settrace(trace)
    try:
        result = run()
    finally:
        sys.settrace(None)
    return counts, result


def count_bytecodes(layers: int = 333, *, tight: bool = False) -> dict[str, Any]:
    """Bytecodes of a half-swapped pass less those of a pass that keeps everything, per swapped
    storage; ``tight``: with the planner's window of one layer (see :class:`EnginePasses`)."""
    passes = EnginePasses.deep_narrow(torch.device("cpu"), layers=layers, tight=tight)
    kept, _ = count_opcodes(lambda: passes.run("keep"))
    swapped, stats = count_opcodes(lambda: passes.run("half"))
    storages = stats.storages_swapped_out
    extra = collections.Counter(swapped)
    extra.subtract(kept)
    return {
        "layers": layers,
        "prefetch_window": "one layer" if tight else "wide",
        "swapped_storages": storages,
        "kept_pass_bytecodes": sum(kept.values()),
        "swapped_pass_bytecodes": sum(swapped.values()),
        "per_swapped_storage": (sum(swapped.values()) - sum(kept.values())) / storages,
        "per_swapped_storage_by_function": {
            name: round(count / storages, 1) for name, count in extra.most_common() if count > 0
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=333)
    parser.add_argument("--results-dir", type=Path, default=None, help="also write JSON under DIR/cpu/")
    parser.add_argument("--name", default="bytecodes")
    args = parser.parse_args(argv)
    counts = count_bytecodes(args.layers)
    tight = count_bytecodes(args.layers, tight=True)
    for figures in (counts, tight):
        print(
            f"{figures['per_swapped_storage']:.1f} bytecodes per swapped storage, prefetch window "
            f"{figures['prefetch_window']} ({figures['swapped_storages']} storages; passes of "
            f"{figures['swapped_pass_bytecodes']} and {figures['kept_pass_bytecodes']} bytecodes)"
        )
        for name, per in list(figures["per_swapped_storage_by_function"].items())[:15]:
            print(f"  {per:7.1f}  {name}")
    if args.results_dir is not None:
        write_result(args.results_dir, torch.device("cpu"), args.name, {**counts, "tight_window": tight})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
