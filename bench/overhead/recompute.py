"""The host cost of recomputation: AccUDNN's recomputing passes against ``torch.utils.checkpoint``.

    python -m bench.overhead.recompute [--steps 4] [--rounds 12] [--results-dir bench/results]
    python -m bench.overhead.recompute --base main --alternations 2   # main's package against this one
    python -m bench.overhead.recompute --profile recompute_all        # cProfile of one row's steps
    python -m bench.overhead.recompute --device cuda --no-count       # a GPU host's cost per step
    python -m bench.overhead.recompute --model gpt2-medium            # GPT-2 medium's 24 blocks

On a GPU whose kernels are short (ResNet-152 at batch 64 on an H200) a training step is bound
by the host: every µs of Python per op, per saved tensor and per recomputed segment is in the
step. This benchmark runs ResNet-152's block structure (50 bottleneck blocks in 3:8:36:3
stages, :func:`~bench.overhead.models.tiny_resnet152`; with ``--model gpt2-medium`` GPT-2
medium's 24 decoder blocks, :func:`~bench.overhead.models.tiny_gpt2_medium`) at tiny sizes on
the CPU, where almost all of a step's time is that host overhead, as training steps (forward,
loss, backward, optimizer step) of:

- ``plain``: no offload;
- ``checkpoint``: every block under non-reentrant ``torch.utils.checkpoint``
  (:func:`bench.techniques.checkpoint.checkpoint_blocks`, as the headline benchmark runs it);
- ``keep``: an :class:`~lightning_accudnn.OffloadSession` at an ample budget (it keeps
  everything) in steady state;
- ``recompute_all`` and ``recompute_half``: a session under policy ``"recompute"`` whose plan
  is forced to recompute every block, or every other one (the planner's search
  replaced, as ``tests/recompute/test_accounting_sets.py`` does), and keep every other layer;
- ``recompute_half_swap``: every other block recomputed, and the second block's layers swapped:
  a plan that recomputes and swaps, whose passes between observed ones keep the engine's hooks
  up to that block's last swapped save only.

It reports per row the median CPU time of the thread per step (``time.thread_time``: the time
other work on a shared machine takes is left out) over interleaved rounds (each round runs
every row's steps in turn), the spread of the rounds' medians, and two counts that do not
depend on the machine, averaged over :data:`COUNTED_STEPS` steps: Python bytecodes per step
(``sys.settrace`` opcode events, as :mod:`bench.overhead.bytecodes` counts) and function calls
per step (``sys.setprofile``: Python functions and C functions called from Python). Every
row's weights after the run are checked bitwise equal to the plain row's (and the sessions'
buffers too: checkpointing updates BatchNorm's running statistics again when it recomputes,
the sessions do not).

With ``--device cuda`` the same rows train on the GPU, where the tiny kernels leave the device
waiting for the host: each step is timed on the wall clock to the device's end
(``torch.cuda.synchronize``; the thread's CPU time would count the spin of that wait) and to the
moment the host has issued it (its forward, backward and optimizer step called, the device not
waited for), so that a row's milliseconds over plain's are what its Python and CUDA calls cost
that GPU's host per step. cuDNN runs deterministic kernels there, so that the rows' weights can
be compared bitwise.

With ``--base REF`` the package ``lightning_accudnn`` of the git revision ``REF`` (its committed
tree, through ``git archive``) and this working tree's are measured alternately, each in its own
process, ``--alternations`` times each; both are written into one result.

Example:
    >>> result = measure(depth=26, steps=1, rounds=1, count=False)
    >>> sorted(result["rows"]) == sorted(ROWS) and result["bitwise_equal"]
    True
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import dataclasses
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn

from bench.environment import REPO_ROOT
from bench.overhead.bytecodes import count_opcodes
from bench.overhead.models import tiny_gpt2_medium, tiny_resnet152
from bench.report import write_result
from bench.runner import batch_on
from bench.techniques.checkpoint import checkpoint_blocks
from bench.workloads import Batch, Workload
from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.planner.recompute import policy_spans
from lightning_accudnn.planner.search import MixedResult
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session.steady_costs import STEADY_TIMED_PASSES
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from lightning_accudnn.testing.forced_plans import forced_result

ROWS = ("plain", "checkpoint", "keep", "recompute_all", "recompute_half", "recompute_half_swap")
#: Profiling, the timed planned passes, then replayed passes: the first timed whole under the
#: refined plan, and under the plan they may re-cost it into. The steady state after these.
WARMUP_STEPS = 3 + TIMED_PLANNED_PASSES + 2 * STEADY_TIMED_PASSES
AMPLE_BUDGET = 8 * 2**30
CPU = torch.device("cpu")
#: Steps counted per row: a session's cycle of one observed pass in ``observe_every`` (the
#: default), so that the counts are a steady-state step's on average.
COUNTED_STEPS = OffloadConfig().observe_every

LABEL = (
    "CPU figures (torch on 1 thread, a shared machine): the thread's CPU time per training step of "
    "{structure} at tiny sizes, where the step is almost all host overhead. Not GPU figures."
)
CUDA_LABEL = (
    "GPU host figures: the wall time per training step, to the device's end, of {structure} at tiny "
    "sizes on {device}, where the device waits for the host: what each row's Python and CUDA calls "
    "cost this machine's host per step, not a training step at real sizes."
)
#: The models whose block structure the rows train (``--model``), and how the labels name them.
MODELS = {"resnet152": "ResNet-152's block structure", "gpt2-medium": "GPT-2 medium's decoder blocks"}


def tiny_model(model: str, depth: int | None = None) -> Workload:
    """The workload of ``model`` (of :data:`MODELS`) at tiny sizes: ``depth`` is ResNet's depth
    (152 by default) or the GPT's number of blocks (24).

    Example:
        >>> tiny_model("gpt2-medium", depth=2).params["layers"]
        2
    """
    if model == "resnet152":
        return tiny_resnet152(depth=152 if depth is None else depth)
    if model == "gpt2-medium":
        return tiny_gpt2_medium(layers=24 if depth is None else depth)
    raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")


@dataclasses.dataclass(frozen=True)
class Forcing:
    """The plan a row's session is forced to: the blocks ``recomputed`` whole, the layers of the
    blocks ``swapped`` swapped, every other layer kept."""

    recomputed: frozenset[str]
    swapped: frozenset[str] = frozenset()


def _forcing(forcing: Forcing) -> Callable[..., MixedResult]:
    """The planner's search replaced by one that makes the plan ``forcing`` names."""

    def search(
        profile: StepProfile,
        cap: int,
        max_limit: int | None = None,
        policy: str = "auto",
        host_fits: object = None,
    ) -> MixedResult:
        candidates = policy_spans(profile, "recompute")
        by_range = {(span.first, span.last): span for span in candidates}
        spans = []
        for name in sorted(forcing.recomputed):
            # A block alone in its stage spans the stage's layers: the planner knows the stage.
            layers = [i for i, layer in enumerate(profile.layers) if layer.name.startswith(name + ".")]
            span = by_range.get((layers[0], layers[-1])) if layers else None
            if span is None:
                raise RuntimeError(f"segment {name} is not recomputable")
            spans.append(span)

        def in_swapped_block(layer: LayerProfile) -> bool:
            return layer.swappable_bytes > 0 and any(
                layer.name.startswith(block + ".") for block in forcing.swapped
            )

        return forced_result(profile, spans, in_swapped_block if forcing.swapped else None)

    return search


@contextlib.contextmanager
def _forced(forcing: Forcing | None) -> Iterator[None]:
    """The planner forced to the plan ``forcing`` names inside (``None``: the planner as it is)."""
    if forcing is None:
        yield
        return
    original = planner_plan.search_mixed
    planner_plan.search_mixed = _forcing(forcing)
    try:
        yield
    finally:
        planner_plan.search_mixed = original


class Row:
    """One row's model, optimizer and batch, and how it runs a training step."""

    def __init__(self, name: str, workload: Workload, batch: Batch, device: torch.device = CPU) -> None:
        self.name = name
        self.workload = workload
        self.device = device
        torch.manual_seed(0)
        self.model: nn.Module = workload.build().to(device)
        blocks = workload.blocks(self.model)
        self.forced: Forcing | None = None
        self.session: OffloadSession | None = None
        if name == "checkpoint":
            checkpoint_blocks(self.model, blocks)
        elif name != "plain":
            policy = "swap" if name == "keep" else "recompute"
            # Plans made at the end of their pass: the forced search replaces the planner's there.
            config = OffloadConfig(
                budget=AMPLE_BUDGET,
                min_swap_bytes=0,
                reserve_bytes=0,
                policy=policy,
                plan_in_background=False,
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.session = OffloadSession(config, device)
            if name == "recompute_all":
                self.forced = Forcing(frozenset(blocks))
            elif name == "recompute_half":
                self.forced = Forcing(frozenset(blocks[::2]))
            elif name == "recompute_half_swap":
                self.forced = Forcing(frozenset(blocks[::2]), swapped=frozenset(blocks[1:2]))
        self.optimizer = workload.optimizer(self.model)
        self.batch = batch

    def step(self) -> None:
        model, optimizer, session = self.model, self.optimizer, self.session
        if session is None:
            self.workload.loss(model, self.batch).backward()
        else:
            with session.step(model, optimizer):
                loss = self.workload.loss(model, self.batch)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def steps(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def timed_steps(self, steps: int) -> list[float]:
        """The seconds of each of ``steps`` steps: the thread's CPU time on the CPU, the wall
        time to the device's end on a GPU (:meth:`timed_steps_on_device`)."""
        if self.device.type == "cuda":
            return [wall for wall, _ in self.timed_steps_on_device(steps)]
        seconds = []
        clock = time.thread_time
        with _forced(self.forced):
            for _ in range(steps):
                start = clock()
                self.step()
                seconds.append(clock() - start)
        return seconds

    def timed_steps_on_device(self, steps: int) -> list[tuple[float, float]]:
        """Per step on a GPU: the wall seconds to the device's end, and to the host's last call."""
        clock = time.perf_counter
        synchronize = torch.cuda.synchronize
        times = []
        with _forced(self.forced):
            synchronize()
            for _ in range(steps):
                start = clock()
                self.step()
                issued = clock()
                synchronize()
                times.append((clock() - start, issued - start))
        return times

    def check_plan(self) -> None:
        if self.session is None:
            return
        plan = self.session.plan
        assert plan is not None
        forced = self.forced or Forcing(frozenset())
        if len(plan.recomputed) != len(forced.recomputed):
            raise RuntimeError(f"{self.name}: the plan recomputes {sorted(plan.recomputed)}")
        if bool(plan.swapped_layers) != bool(forced.swapped):
            raise RuntimeError(f"{self.name}: the plan swaps {sorted(plan.swapped_layers)}")

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def count_calls(run: Callable[[], Any]) -> tuple[int, int]:
    """Python function calls and C function calls (from Python) while ``run()`` runs.

    Example:
        >>> python, c = count_calls(lambda: sorted([3, 1]))
        >>> python >= 1 and c >= 1
        True
    """
    counts = collections.Counter[str]()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        counts[event] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counts["call"], counts["c_call"]


def measure(
    depth: int | None = None,
    steps: int = 4,
    rounds: int = 12,
    *,
    count: bool = True,
    counted_steps: int = COUNTED_STEPS,
    top: int = 25,
    device: torch.device = CPU,
    model: str = "resnet152",
) -> dict[str, Any]:
    """Every row's time per step over ``rounds`` interleaved rounds of ``steps`` steps (the
    thread's CPU time on the CPU; on a GPU the wall time to the device's end, and to the host's
    last call), and (``count``) its bytecodes and function calls per step over ``counted_steps``
    steps; ``top`` functions whose bytecodes differ most between ``recompute_all`` and
    ``checkpoint``. The rows train ``model`` at ``depth`` (:func:`tiny_model`)."""
    torch.set_num_threads(1)
    on_device = device.type == "cuda"
    workload = tiny_model(model, depth)
    batch = batch_on(workload.make_batch(0), device)
    with _deterministic_cudnn(on_device):
        rows = {name: Row(name, workload, batch, device) for name in ROWS}
        try:
            return _measure(rows, workload, model, steps, rounds, count, counted_steps, top, device)
        finally:
            for row in rows.values():
                row.close()


@contextlib.contextmanager
def _deterministic_cudnn(on: bool) -> Iterator[None]:
    """cuDNN's deterministic kernels inside (when ``on``): rows bitwise comparable on a GPU."""
    if not on:
        yield
        return
    before = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


def _measure(
    rows: dict[str, Row],
    workload: Workload,
    model: str,
    steps: int,
    rounds: int,
    count: bool,
    counted_steps: int,
    top: int,
    device: torch.device,
) -> dict[str, Any]:
    """:func:`measure`'s rounds, counts and record, for the ``rows`` built on ``device``."""
    on_device = device.type == "cuda"
    for row in rows.values():
        row.timed_steps(WARMUP_STEPS)
        row.check_plan()
    per_round: dict[str, list[float]] = {name: [] for name in ROWS}
    every: dict[str, list[float]] = {name: [] for name in ROWS}
    issued: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(rounds):
        for name, row in rows.items():
            if on_device:
                times = row.timed_steps_on_device(steps)
                seconds = [wall for wall, _ in times]
                issued[name].extend(issue for _, issue in times)
            else:
                seconds = row.timed_steps(steps)
            every[name].extend(seconds)
            per_round[name].append(statistics.median(seconds))
    bytecodes: dict[str, collections.Counter[str]] = {}
    calls: dict[str, tuple[int, int]] = {}
    if count:
        for name, row in rows.items():
            with _forced(row.forced):
                bytecodes[name] = count_opcodes(lambda row=row: row.steps(counted_steps))[0]
                calls[name] = count_calls(lambda row=row: row.steps(counted_steps))
    for row in rows.values():
        row.check_plan()
    equal = _bitwise_equal(rows)
    plain = statistics.median(every["plain"])
    result_rows: dict[str, Any] = {}
    for name in ROWS:
        median = statistics.median(every[name])
        result_rows[name] = {
            "wall_ms_per_step" if on_device else "cpu_ms_per_step": median * 1e3,
            "round_medians_ms": [min(per_round[name]) * 1e3, max(per_round[name]) * 1e3],
            "over_plain": median / plain,
        }
        if on_device:
            result_rows[name]["issue_ms_per_step"] = statistics.median(issued[name]) * 1e3
        if count:
            result_rows[name]["bytecodes_per_step"] = round(sum(bytecodes[name].values()) / counted_steps)
            result_rows[name]["python_calls_per_step"] = round(calls[name][0] / counted_steps)
            result_rows[name]["c_calls_per_step"] = round(calls[name][1] / counted_steps)
    record: dict[str, Any] = {
        "kind": "recompute-host",
        "label": (
            CUDA_LABEL.format(structure=MODELS[model], device=torch.cuda.get_device_name(device))
            if on_device
            else LABEL.format(structure=MODELS[model])
        ),
        "device": str(device),
        "model": {"workload": f"tiny {model}", **workload.params},
        "steps_per_round": steps,
        "rounds": rounds,
        "warmup_steps": WARMUP_STEPS,
        "counted_steps": counted_steps if count else 0,
        "rows": result_rows,
        "bitwise_equal": equal["all"],
        "equality": equal,
    }
    if count:
        difference = collections.Counter(bytecodes["recompute_all"])
        difference.subtract(bytecodes["checkpoint"])
        record["bytecodes_per_step_by_file"] = {
            name: _by_file(bytecodes[name], counted_steps) for name in ("checkpoint", "recompute_all")
        }
        record["recompute_all_less_checkpoint_bytecodes_per_step"] = {
            function: round(count / counted_steps)
            for function, count in sorted(difference.items(), key=lambda item: -abs(item[1]))[:top]
        }
    return record


def _by_file(counts: collections.Counter[str], steps: int, top: int = 10) -> dict[str, int]:
    """Bytecodes per step by source file (``torch/utils/checkpoint.py`` is ``checkpoint.py``)."""
    files: collections.Counter[str] = collections.Counter()
    for function, count in counts.items():
        files[function.partition(":")[0]] += count
    return {file: round(count / steps) for file, count in files.most_common(top)}


def _bitwise_equal(rows: dict[str, Row]) -> dict[str, bool]:
    """Per row: its parameters (and, for the sessions, buffers) bitwise the plain row's."""
    reference = rows["plain"].model.state_dict()
    parameters = {name for name, _ in rows["plain"].model.named_parameters()}
    equal = {}
    for name, row in rows.items():
        state = {key.replace(".block.", "."): value for key, value in row.model.state_dict().items()}
        keys = reference.keys() if row.session is not None or name == "plain" else parameters
        equal[name] = all(torch.equal(reference[key], state[key]) for key in keys)
    equal["all"] = all(equal.values())
    return equal


def profile_row(
    name: str,
    depth: int | None = None,
    steps: int = 20,
    lines: int = 40,
    device: torch.device = CPU,
    model: str = "resnet152",
) -> str:
    """cProfile of ``steps`` steady-state steps of row ``name`` (``model`` at ``depth``, as
    :func:`measure` trains it): the top functions by own time."""
    torch.set_num_threads(1)
    workload = tiny_model(model, depth)
    row = Row(name, workload, batch_on(workload.make_batch(0), device), device)
    try:
        row.timed_steps(WARMUP_STEPS)
        profiler = cProfile.Profile()
        with _forced(row.forced):
            profiler.enable()
            for _ in range(steps):
                row.step()
            profiler.disable()
    finally:
        row.close()
    out = _Text()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(lines)  # type: ignore[arg-type]
    return out.text


class _Text:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text


def _markdown(record: dict[str, Any]) -> str:
    runs = record.get("runs")
    if runs is None:
        runs = {"this tree": [record]}
    on_device = next(iter(runs.values()))[0].get("device", "cpu").startswith("cuda")
    lines = [
        f"# Host cost of recomputation ({'GPU host' if on_device else 'CPU'})",
        "",
        record["label"],
        "",
    ]
    clock = "CPU ms/step (runs)"
    if on_device:
        clock = "wall ms/step to the device's end (runs) | host issued (ms)"
    for source, measured in runs.items():
        lines += [
            f"## {source}",
            "",
            f"| row | {clock} | over plain | bytecodes/step | Python calls/step | C calls/step |",
            f"| --- | --- |{' --- |' if on_device else ''} --- | --- | --- | --- |",
        ]
        for name in ROWS:
            cells = [run["rows"][name] for run in measured]
            key = "wall_ms_per_step" if on_device else "cpu_ms_per_step"
            ms = ", ".join(f"{cell[key]:.2f}" for cell in cells)
            if on_device:
                ms += " | " + ", ".join(f"{cell['issue_ms_per_step']:.2f}" for cell in cells)
            ratio = ", ".join(f"{cell['over_plain']:.2f}" for cell in cells)
            first = cells[0]
            lines.append(
                f"| {name} | {ms} | {ratio} | {first.get('bytecodes_per_step', '-')} | "
                f"{first.get('python_calls_per_step', '-')} | {first.get('c_calls_per_step', '-')} |"
            )
        equal = all(run["bitwise_equal"] for run in measured)
        lines += ["", f"Weights (and the sessions' buffers) bitwise equal to plain: {equal}.", ""]
    return "\n".join(lines) + "\n"


def _run_in(directory: Path, arguments: list[str]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    subprocess.run(
        [sys.executable, "-m", "bench.overhead.recompute", *arguments, "--raw", str(out)],
        cwd=directory,
        check=True,
    )
    record: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return record


def compare(base: str, alternations: int, arguments: list[str]) -> dict[str, Any]:
    """``base``'s committed ``lightning_accudnn`` against this tree's, alternately in processes."""
    revision = subprocess.run(
        ["git", "rev-parse", "--short", base], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    runs: dict[str, list[dict[str, Any]]] = {f"base {base} ({revision})": [], f"this tree ({head}+)": []}
    with tempfile.TemporaryDirectory() as scratch:
        base_dir = Path(scratch)
        archive = subprocess.run(
            ["git", "archive", base, "lightning_accudnn"], cwd=REPO_ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
        (base_dir / "bench").symlink_to(REPO_ROOT / "bench")
        base_runs, tree_runs = runs.values()
        for _ in range(alternations):
            base_runs.append(_run_in(base_dir, arguments))
            tree_runs.append(_run_in(REPO_ROOT, arguments))
    return {
        "kind": "recompute-host-compare",
        "label": base_runs[0]["label"] + " Each run is one process; base and this tree alternate.",
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=MODELS, default="resnet152", help="whose blocks the rows train")
    parser.add_argument("--depth", type=int, help="ResNet's depth (152) or the GPT's blocks (24)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: a GPU host's cost per step")
    parser.add_argument("--steps", type=int, default=4, help="steps per row per round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--no-count", action="store_true", help="skip the bytecode and call counts")
    parser.add_argument("--counted-steps", type=int, default=COUNTED_STEPS, help="steps counted per row")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument("--name", default="recompute-host")
    parser.add_argument("--base", help="a git revision whose lightning_accudnn to compare against")
    parser.add_argument("--alternations", type=int, default=2)
    parser.add_argument("--profile", choices=ROWS, help="print a cProfile of this row and exit")
    parser.add_argument("--raw", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch here")
    if args.profile:
        print(profile_row(args.profile, depth=args.depth, device=device, model=args.model))
        return 0
    common = ["--model", args.model, "--steps", str(args.steps), "--rounds", str(args.rounds)]
    if args.depth is not None:
        common += ["--depth", str(args.depth)]
    common += ["--device", args.device]
    common += ["--counted-steps", str(args.counted_steps)]
    if args.no_count:
        common.append("--no-count")
    if args.base:
        record = compare(args.base, args.alternations, common)
    else:
        record = measure(
            args.depth,
            args.steps,
            args.rounds,
            count=not args.no_count,
            counted_steps=args.counted_steps,
            device=device,
            model=args.model,
        )
    if args.raw:
        args.raw.write_text(json.dumps(record))
        return 0
    print(_markdown(record))
    write_result(args.results_dir, device, args.name, record, _markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
