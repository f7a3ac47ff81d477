"""Machine instructions per swapped storage, counted by callgrind: the host cost without the clock's noise.

    python -m bench.overhead.instructions [--layers 40] [--passes 2] [--results-dir bench/results]

On this project's shared machine, the same pass takes from one to two times as long from one
minute to the next, so wall-clock figures cannot tell apart changes of a few µs per swapped
storage; bytecodes (:mod:`bench.overhead.bytecodes`) do not vary but see none of the C under
them (PyTorch's dispatch, CPython's allocations), which is most of a swap. This counts the
instructions the host executes, with valgrind's callgrind: a count that does not depend on the
machine's speed or load.

It runs :mod:`bench.overhead.lean`'s passes of the deep narrow model (the engine replayed by
ordinal keeping everything and with its first half swapped through a window of one layer, and
the lean hooks' same two) and the same pass of plain autograd, each for ``--passes`` passes
after two unmeasured ones, in a Python process under ``valgrind --tool=callgrind``. Each
variant's passes run inside a ctypes callback, so inside libffi's ``ffi_call``, the one function
callgrind is told to count in and to dump its count after (``--collect-atstart=no
--toggle-collect=ffi_call --dump-after=ffi_call``): one count per variant, and nothing of the
imports or the set-up. The result gives per pass the instructions of each variant, and:

- per swapped storage, the engine's and the lean hooks' (half swapped less keeping, over the
  storages swapped);
- per saved tensor, the floor of a hooks pair that keeps every tensor (the lean keeping pass
  less plain autograd's, over the tensors saved).

The counts are of a short model (``--layers``, 40 by default: under callgrind a pass runs about
fifty times slower, and importing torch alone takes minutes), and depend on the CPU's
instruction set and the libraries' builds, not on the machine's load: two runs of the same code
on this machine agreed to within 1% per swap (the engine's to 16 instructions in 97 thousand;
Python's hash seed is fixed). They measure work, not time: an instruction that misses the cache
costs more than one that hits.

Needs ``valgrind`` on the path (exit status 2 and a message without it). Writes
``<results-dir>/cpu/<date>-<name>.json`` with the environment.

Example:
    >>> counts = instruction_counts(["engine half", "engine keep"], [[5, 6, 7], [2, 3, 4]], passes=1)
    >>> counts == {"engine half": 18.0, "engine keep": 9.0}
    True
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.report import write_result

#: What each counted region runs, in this order (``lean`` and ``engine`` as in bench.overhead.lean).
VARIANTS = ("plain", "lean keep", "lean half", "engine keep", "engine half")
_VALGRIND_ARGS = (
    "--tool=callgrind",
    "--collect-atstart=no",
    "--toggle-collect=ffi_call",
    "--dump-after=ffi_call",
)
_REGIONS_FILE = "regions.json"
_DUMP_PREFIX = "callgrind.out"
_SUMMARY = re.compile(r"^summary:\s*(\d+)", re.MULTILINE)
_Region = ctypes.CFUNCTYPE(None)


def run_in_region(run: Callable[[], object]) -> None:
    """Call ``run`` through a ctypes callback: inside ``ffi_call``, where callgrind counts.

    Example:
        >>> calls = []
        >>> run_in_region(lambda: calls.append(1)); calls
        [1]
    """
    failures: list[BaseException] = []

    def region() -> None:
        try:
            run()
        except BaseException as error:  # an exception cannot cross the C frame: raised after it
            failures.append(error)

    _Region(region)()
    if failures:
        raise failures[0]


def instruction_counts(
    labels: Sequence[str], dumps: Sequence[Sequence[int]], passes: int
) -> dict[str, float]:
    """Per label, the instructions of one pass: the sum of its dumps' counts over ``passes``."""
    return {label: sum(counts) / passes for label, counts in zip(labels, dumps, strict=True)}


def dump_count(path: Path) -> int:
    """The instructions a callgrind dump counted (its ``summary:`` line).

    Example:
        >>> import tempfile
        >>> dump = Path(tempfile.mkdtemp()) / "callgrind.out.1"
        >>> _ = dump.write_text("events: Ir\\nsummary: 1234\\ntotals: 1234\\n")
        >>> dump_count(dump)
        1234
    """
    found = _SUMMARY.search(path.read_text(errors="replace"))
    if found is None:
        raise ValueError(f"{path} is not a callgrind dump (no summary line)")
    return int(found.group(1))


def _child(layers: int, passes: int, out: Path) -> None:
    """Under callgrind: run each variant's passes in a region, and note which dumps it wrote."""
    from bench.overhead.engine_passes import EnginePasses
    from bench.overhead.lean import KeepHooks, LeanSwaps, run_pass
    from lightning_accudnn.ops.replay import ReplayRoute

    engine = EnginePasses.deep_narrow(torch.device("cpu"), layers=layers, tight=True)
    lean = LeanSwaps(ReplayRoute(engine.profiles["half"].sequence, engine.schedules["half"]))
    keep = KeepHooks()
    runs: dict[str, Callable[[], object]] = {
        "plain": lambda: run_pass(engine, None),
        "lean keep": lambda: run_pass(engine, keep),
        "lean half": lambda: run_pass(engine, lean.new_pass()),
        "engine keep": lambda: engine.run("keep"),
        "engine half": lambda: engine.run("half"),
    }
    saves = KeepHooks()
    run_pass(engine, saves)
    regions: dict[str, Any] = {
        "swapped_storages": {"engine": engine.run("half").storages_swapped_out, "lean": len(lean.sizes)},
        "saved_tensors": saves.calls,
        "dumps": {},
    }
    for name in VARIANTS:
        run = runs[name]
        for _ in range(2):  # unmeasured: the engine's route compiled, the pools and caches filled
            run()
        before = set(out.glob(f"{_DUMP_PREFIX}*"))

        def measured(run: Callable[[], object] = run) -> None:
            for _ in range(passes):
                run()

        run_in_region(measured)
        regions["dumps"][name] = sorted(path.name for path in set(out.glob(f"{_DUMP_PREFIX}*")) - before)
    engine.close()
    (out / _REGIONS_FILE).write_text(json.dumps(regions))


def measure(layers: int = 40, passes: int = 2, valgrind: str = "valgrind") -> dict[str, Any]:
    """Run the variants under callgrind (see the module docstring) and return their counts."""
    with tempfile.TemporaryDirectory(prefix="accudnn-callgrind-") as directory:
        out = Path(directory)
        command = [
            valgrind,
            *_VALGRIND_ARGS,
            f"--callgrind-out-file={out / _DUMP_PREFIX}",
            sys.executable,
            "-m",
            "bench.overhead.instructions",
            "--child",
            str(out),
            "--layers",
            str(layers),
            "--passes",
            str(passes),
        ]
        environment_variables = {**os.environ, "PYTHONHASHSEED": "0"}
        completed = subprocess.run(command, env=environment_variables, capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"the run under callgrind failed:\n{completed.stderr[-4000:]}")
        regions = json.loads((out / _REGIONS_FILE).read_text())
        dumps = [[dump_count(out / name) for name in regions["dumps"][label]] for label in VARIANTS]
    if not all(dumps):
        raise RuntimeError(
            "callgrind wrote no count for a region: is ffi_call the ctypes call on this build?"
        )
    per_pass = instruction_counts(VARIANTS, dumps, passes)
    swapped = regions["swapped_storages"]

    def per_swap(kind: str) -> float:
        return (per_pass[f"{kind} half"] - per_pass[f"{kind} keep"]) / swapped[kind]

    return {
        "layers": layers,
        "passes": passes,
        "swapped_storages": swapped,
        "saved_tensors": regions["saved_tensors"],
        "instructions_per_pass": per_pass,
        "instructions_per_swap": {"engine": per_swap("engine"), "lean": per_swap("lean")},
        "hook_floor_instructions_per_saved_tensor": (per_pass["lean keep"] - per_pass["plain"])
        / regions["saved_tensors"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument("--passes", type=int, default=2, help="counted passes of each variant")
    parser.add_argument("--results-dir", type=Path, default=None, help="also write JSON under DIR/cpu/")
    parser.add_argument("--name", default="instructions")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # every operation on the calling thread, inside its region
        try:
            _child(args.layers, args.passes, args.child)
        finally:
            torch.set_num_threads(threads)
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print(
            "bench.overhead.instructions needs valgrind (callgrind) on the path: install it "
            "(apt install valgrind) or use bench.overhead.bytecodes, which needs nothing",
            file=sys.stderr,
        )
        return 2
    result = measure(args.layers, args.passes, valgrind)
    swaps = result["instructions_per_swap"]
    print(
        f"CPU instructions (callgrind), deep narrow model ({args.layers} layers), half swapped, window "
        f"of one layer: the engine {swaps['engine']:.0f} and the lean hooks {swaps['lean']:.0f} per "
        f"swapped storage ({result['swapped_storages']['engine']} a pass); a bare hooks pair "
        f"{result['hook_floor_instructions_per_saved_tensor']:.0f} per saved tensor"
    )
    if args.results_dir is not None:
        label = "CPU instructions counted by callgrind: work, not time; not GPU figures"
        record = {"kind": "bench.overhead.instructions", "label": label, **result}
        write_result(args.results_dir, torch.device("cpu"), args.name, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
