"""The one-command GPU check: the headline comparison, CUDA tests, the same under the CUDA sanitizer,
the benchmarks, one bundle.

    python -m bench.gpu_check              # everything (hours on a big GPU: the benchmarks dominate)
    python -m bench.gpu_check --steps headline-resnet152-bf16,headline-gpt2-medium-bf16
    python -m bench.gpu_check --list       # what it would run, with time limits (works without a GPU)

The headline runs first, so that a short window on a GPU answers the question the project exists
for: ``bench.run`` on ResNet-152 (batch 64, bf16) and a GPT-2-medium-shaped decoder (bf16), rows
no offload, lightning-accudnn at half the peak no offload holds and at the model state plus a half
and plus a third of the activations no offload holds, full per-block checkpointing, ``save_on_cpu``
and torchtune's ``OffloadActivations`` (a ``not_installed`` row without it); each row has its measured median
step and peak and, for lightning-accudnn, the plan's predicted step and peak. Each headline
command has a time limit under 8 minutes (:data:`HEADLINE_SECONDS`). ``Step.quick`` is the same
command at CPU sizes in seconds: CI runs it (``tests/bench/test_gpu_check.py``).

Then ``recompute-host`` (``bench.overhead.recompute --device cuda``, under 5 minutes) times
ResNet-152's block structure at tiny sizes on the GPU, where the device waits for the host:
what recomputing every block, every other block (and swapping), per-block checkpointing and a
session keeping everything cost that machine's host per step, the part of the headline's
steps that its device time does not explain; ``recompute-host-gpt2-medium`` the same for GPT-2
medium's 24 decoder blocks (its headline at half the activations recomputes only).

After the CUDA tests and ``bench.calibration``, ``trace-check-gpt2-medium-bf16`` and
``trace-check-resnet152-bf16`` run ``bench.trace_check``: what one training step saves for
backward, per kind of layer, as the planner's trace for this GPU counts it and as the GPU's own
kernels save it (a trace on the host and two training steps; 5 minutes each at most).

Each step runs as its own process (as a user would type it), its output going to a log.
Then ``bench/results/<device>/<date>-gpu-check.json`` records the device name, torch, CUDA,
cuDNN and driver versions, the git commit, and per step the command, exit status, wall time,
log file and the result files it wrote (the benchmarks write theirs next to it, under the
same ``bench/results/<device>/``). Logs go to ``bench/results/<device>/<date>-gpu-check/``.
Commit the whole bundle as it is. Without CUDA it writes nothing and exits with status 2.

Example:
    >>> [step.name for step in STEPS][:5]  # doctest: +NORMALIZE_WHITESPACE
    ['headline-resnet152-bf16', 'headline-gpt2-medium-bf16', 'recompute-host',
     'recompute-host-gpt2-medium', 'cuda-tests']
    >>> select_steps("overhead")[0].argv[:2]
    ['-m', 'bench.overhead']
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.environment import REPO_ROOT

EXIT_NO_CUDA = 2
NO_CUDA_MESSAGE = (
    "bench.gpu_check: no CUDA device is visible to torch {torch} (built with CUDA {cuda}), so there is "
    "nothing to check here and nothing was written. Run it on a machine with an NVIDIA GPU, a CUDA build "
    'of torch and its driver (`python -c "import torch; print(torch.cuda.is_available())"` must print '
    "True); CUDA_VISIBLE_DEVICES must not hide the GPU."
)


@dataclass(frozen=True)
class Step:
    """One command of the check: its name, arguments after the interpreter, extra environment, time limit."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: int = 4 * 3600
    writes_results: bool = True  # a benchmark: told to write under the check's --results-dir
    #: Arguments appended to ``argv`` for the same command at CPU sizes (CI's quick run)
    quick: list[str] = field(default_factory=list)

    def command(self, results_dir: Path | None = None) -> list[str]:
        """The command line; a benchmark's writes its results under ``results_dir`` when given.

        Example:
            >>> Step("b", ["-m", "bench.run"]).command(Path("out"))[1:]
            ['-m', 'bench.run', '--results-dir', 'out']
        """
        extra = ["--results-dir", str(results_dir)] if self.writes_results and results_dir is not None else []
        return [sys.executable, *self.argv, *extra]


PYTEST = ["-m", "pytest", "-m", "cuda", "tests/gpu", "-q", "-rA", "-p", "no:cacheprovider"]

#: Time limit of each headline command: under 8 minutes, the two under 20 with the rest's start.
HEADLINE_SECONDS = 450
#: The rows of the headline (``bench.run`` arguments): no offload, lightning-accudnn at half the
#: no-offload peak and at the model state plus 1/2 and 1/3 of the activations, save_on_cpu,
#: torchtune, per-block checkpointing.
#: Six warm-up steps (up to twelve while a technique has not settled): a session's profiling
#: pass, two timed passes, the refined plan's first pass and three passes timing its
#: recomputations come before its plan is final.
HEADLINE_ROWS = [
    "--strategies",
    "oracle,accudnn,save_on_cpu,torchtune,checkpoint",
    "--reductions",
    "2",
    "--activation-fractions",
    "1/2,1/3",
    "--policies",
    "auto",
    "--warmup",
    "6",
    "--steps",
    "6",
]
#: The environment of every step that trains under a budget: the caching allocator maps its
#: segments in 2 MB pages and grows them in place, so that the budget's cap
#: (``torch.cuda.set_per_process_memory_fraction``, which counts reserved bytes) is not spent on
#: memory reserved but unallocated. On the H200 a GPT-2-medium plan ran out of memory under its
#: 8.89 GiB cap with 6.53 GiB allocated and 2.68 GiB reserved but unallocated
#: (``bench/results/nvidia-h200/2026-11-26-at-dc4938e``). Every row of a command runs in its
#: process, so the peers run with it too; each JSON file records it
#: (``environment.pytorch_cuda_alloc_conf``).
BUDGETED = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

#: The two headline workloads, as ``bench.run`` and ``bench.calibration`` take them.
RESNET152_B64_BF16 = ["--workload", "resnet152", "--param", "batch_size=64", "--param", "precision=bf16"]
GPT2_MEDIUM_BF16 = ["--workload", "gpt", "--param", "precision=bf16"]

#: The calibrations' warm-up: the session at half the activations times its refined plan's
#: recomputations in the passes after its first, and may plan once more from them.
CALIBRATION_WARMUP = ["--warmup", "10"]

#: The budgets of the peak predictions, as fractions of the kept peak: about the headline's half
#: of the activations, and half of the kept peak (the issue's "no more than half") and below.
PEAK_PREDICTION = ["--fractions", "0.66,0.56,0.5,0.4", "--policies", "auto", "--steps", "8"]

#: CPU sizes for the quick run of a headline command: every row, in seconds, no GPU.
QUICK_CPU = ["--device", "cpu", "--min-swap-bytes", "0", "--warmup", "3", "--steps", "1", "--no-plot"]

#: Time limit of the ``recompute-host`` step (six rows of tiny steps; the counts are the CPU's).
RECOMPUTE_HOST_SECONDS = 300
#: Its quick CPU form: a shallower model, one round of one step.
RECOMPUTE_HOST_QUICK = ["--device", "cpu", "--depth", "26", "--steps", "1", "--rounds", "1"]
#: Time limit of each ``bench.trace_check`` step (a trace on the host, one measured training step).
TRACE_CHECK_SECONDS = 300
#: The quick CPU form of a ``bench.trace_check`` step: the tiny case of the planner table.
TRACE_CHECK_QUICK = ["--case", "tiny", "--device", "cpu", "--batch-size", "2"]

#: Every step, in the order they run: the headline first (GPU time comes in short windows), then
#: the tests (a failure there makes the later figures suspect), then the long benchmarks.
STEPS = (
    Step(
        "headline-resnet152-bf16",
        ["-m", "bench.run", *RESNET152_B64_BF16, *HEADLINE_ROWS, "--name", "headline-resnet152-b64-bf16"],
        timeout_seconds=HEADLINE_SECONDS,
        quick=[
            *QUICK_CPU,
            *("--param", "base_width=4", "--param", "image_size=64", "--param", "batch_size=4"),
            *("--param", "precision=fp32"),  # bf16 convolutions are slow on a CPU
        ],
        env=BUDGETED,
    ),
    Step(
        "headline-gpt2-medium-bf16",
        ["-m", "bench.run", *GPT2_MEDIUM_BF16, *HEADLINE_ROWS, "--name", "headline-gpt2-medium-bf16"],
        timeout_seconds=HEADLINE_SECONDS,
        quick=[
            *QUICK_CPU,
            *("--param", "layers=4", "--param", "d_model=64", "--param", "heads=4"),
            *("--param", "seq_len=64", "--param", "vocab=64", "--param", "batch_size=8"),
        ],
        env=BUDGETED,
    ),
    Step(
        "recompute-host",
        ["-m", "bench.overhead.recompute", "--device", "cuda", "--no-count"],
        timeout_seconds=RECOMPUTE_HOST_SECONDS,
        quick=RECOMPUTE_HOST_QUICK,
    ),
    Step(
        "recompute-host-gpt2-medium",
        [
            *("-m", "bench.overhead.recompute", "--device", "cuda", "--no-count"),
            *("--model", "gpt2-medium", "--name", "recompute-host-gpt2-medium"),
        ],
        timeout_seconds=RECOMPUTE_HOST_SECONDS,
        quick=["--device", "cpu", "--depth", "2", "--steps", "1", "--rounds", "1"],
    ),
    Step("cuda-tests", PYTEST, timeout_seconds=3600, writes_results=False),
    Step(
        "calibration-resnet152-bf16",
        ["-m", "bench.calibration", *RESNET152_B64_BF16, *CALIBRATION_WARMUP],
        timeout_seconds=600,
        env=BUDGETED,
    ),
    Step(
        "calibration-gpt2-medium-bf16",
        ["-m", "bench.calibration", *GPT2_MEDIUM_BF16, *CALIBRATION_WARMUP],
        timeout_seconds=600,
        env=BUDGETED,
    ),
    Step(
        "trace-check-gpt2-medium-bf16",
        ["-m", "bench.trace_check", "--case", "gpt2-medium-bf16"],
        timeout_seconds=TRACE_CHECK_SECONDS,
        quick=TRACE_CHECK_QUICK,
    ),
    Step(
        "trace-check-resnet152-bf16",
        ["-m", "bench.trace_check", "--case", "resnet152-bf16"],
        timeout_seconds=TRACE_CHECK_SECONDS,
        quick=TRACE_CHECK_QUICK,
    ),
    Step(
        "peak-prediction-resnet152-bf16",
        ["-m", "bench.peak_prediction", *RESNET152_B64_BF16, *PEAK_PREDICTION],
        timeout_seconds=600,
        env=BUDGETED,
    ),
    Step(
        "peak-prediction-gpt2-medium-bf16",
        ["-m", "bench.peak_prediction", *GPT2_MEDIUM_BF16, *PEAK_PREDICTION],
        timeout_seconds=600,
        env=BUDGETED,
    ),
    Step(
        "cuda-tests-sanitizer",
        PYTEST,
        env={"TORCH_CUDA_SANITIZER": "1"},
        timeout_seconds=3 * 3600,
        writes_results=False,
    ),
    Step("overhead", ["-m", "bench.overhead", "--device", "cuda"], timeout_seconds=3600),
    Step("hostprofile", ["-m", "bench.overhead.hostprofile", "--device", "cuda"], timeout_seconds=1800),
    Step(
        "bench-resnet152-bf16",
        ["-m", "bench.run", "--workload", "resnet152", "--precision", "bf16"],
        env=BUDGETED,
    ),
    Step(
        "bench-resnet152-fp32",
        ["-m", "bench.run", "--workload", "resnet152", "--precision", "fp32"],
        env=BUDGETED,
    ),
    Step("bench-gpt", ["-m", "bench.run", "--workload", "gpt"], env=BUDGETED),
    Step(
        "bench-deep-resnet-1001",
        ["-m", "bench.run", "--workload", "deep_resnet", "--param", "depth=1001", "--batch-size", "16"],
        env=BUDGETED,
    ),
    Step("bench-deepest-12GB", ["-m", "bench.deepest", "--budget", "12GB"], env=BUDGETED),
)


def quick_command(step: Step, results_dir: Path) -> list[str]:
    """A step's command at CPU sizes (its :attr:`Step.quick` arguments appended), writing under
    ``results_dir``: what CI runs (the headline steps and the trace checks have one).

    Example:
        >>> quick_command(STEPS[0], Path("out"))[-2:]
        ['--results-dir', 'out']
    """
    if not step.quick:
        raise ValueError(f"step {step.name!r} has no quick CPU form")
    return [*step.argv, *step.quick, "--results-dir", str(results_dir)]


def select_steps(names: str | None) -> list[Step]:
    """The steps named (comma-separated, in the check's order), or all of them.

    Example:
        >>> [step.name for step in select_steps("bench-gpt,cuda-tests")]
        ['cuda-tests', 'bench-gpt']
        >>> [step.timeout_seconds < 8 * 60 for step in select_steps("headline-resnet152-bf16")]
        [True]
        >>> select_steps("nope")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        SystemExit: bench.gpu_check: unknown steps ['nope']; choose from headline-resnet152-bf16, ...
    """
    if not names:
        return list(STEPS)
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    known = [step.name for step in STEPS]
    unknown = sorted(wanted - set(known))
    if unknown:
        raise SystemExit(f"bench.gpu_check: unknown steps {unknown}; choose from {', '.join(known)}")
    return [step for step in STEPS if step.name in wanted]


def _files_under(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir() if path.is_file()} if folder.exists() else set()


def run_step(step: Step, log_path: Path, results_folder: Path) -> dict[str, Any]:
    """Run one step with its output in ``log_path``; what it did as plain data."""
    before = _files_under(results_folder)
    started = time.time()
    environment = {**os.environ, **step.env}
    command = step.command(results_folder.parent)
    arguments = " ".join(command[1:])
    print(f"bench.gpu_check: {step.name}: {arguments} (log {log_path.name})", flush=True)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(f'{k}={v}' for k, v in step.env.items())} python {arguments}\n")
        log.flush()
        try:
            completed = subprocess.run(
                command,
                cwd=REPO_ROOT,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=step.timeout_seconds,
                check=False,
            )
            returncode: int | None = completed.returncode
            status = "passed" if returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            returncode, status = None, "timeout"
    record = {
        "name": step.name,
        "command": f"python {arguments}",
        "env": step.env,
        "status": status,
        "returncode": returncode,
        "wall_seconds": time.time() - started,
        "log": f"{log_path.parent.name}/{log_path.name}",
        "result_files": sorted(_files_under(results_folder) - before),
    }
    print(f"bench.gpu_check: {step.name}: {status} in {record['wall_seconds']:.0f} s", flush=True)
    return record


def _nvidia_smi() -> str:
    try:
        completed = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi not available: {error}"
    return completed.stdout + completed.stderr


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_check",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument(
        "--steps", help="comma-separated subset of: " + ", ".join(step.name for step in STEPS)
    )
    parser.add_argument("--list", action="store_true", help="print the steps and exit (no GPU needed)")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.gpu_check``; returns the exit status (0: every step passed)."""
    args = build_parser().parse_args(argv)
    steps = select_steps(args.steps)
    if args.list:
        for step in steps:
            env = "".join(f"{key}={value} " for key, value in step.env.items())
            print(f"{step.name}: {env}python {shlex.join(step.argv)}  [time limit {step.timeout_seconds} s]")
        return 0
    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE.format(torch=torch.__version__, cuda=torch.version.cuda), file=sys.stderr)
        return EXIT_NO_CUDA
    return _check(steps, args.results_dir)


def _check(steps: list[Step], results_dir: Path) -> int:
    from bench.environment import device_slug, environment
    from bench.report import output_stem, write_json

    device = torch.device("cuda", torch.cuda.current_device())
    stem = output_stem(results_dir, device_slug(device), "gpu-check")
    logs = stem.parent / stem.name
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "nvidia-smi.log").write_text(_nvidia_smi(), encoding="utf-8")
    summary: dict[str, Any] = {
        "kind": "bench.gpu_check",
        "schema": 1,
        "environment": environment(device),
        "argv": sys.argv[1:],
        "logs": logs.name,
        "steps": [],
    }
    started = time.time()
    for step in steps:
        summary["steps"].append(run_step(step, logs / f"{step.name}.log", stem.parent))
        summary["wall_seconds"] = time.time() - started
        write_json(stem.with_suffix(".json"), summary)  # after every step: a crash keeps what ran
    failed = [record["name"] for record in summary["steps"] if record["status"] != "passed"]
    print(
        f"bench.gpu_check: wrote {stem}.json and {logs}/; "
        + (f"failed: {failed}" if failed else "all passed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
