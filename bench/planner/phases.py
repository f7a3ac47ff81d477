"""``python -m bench.planner.phases CASE BUDGET GPU``: the CLI's work in phases, timed in a fresh process.

Prints one JSON line: the wall and the CPU seconds (``{"wall": {...}, "cpu": {...}}``; CPU
seconds count this process only and vary less on a shared machine) of importing the CLI,
the first ``FakeTensorMode`` (it imports ``torch._dynamo``), the model's library, the trace,
the profile and the plan (at ``BUDGET`` bytes). Only the standard library is imported before
the first phase starts, so each phase pays its own imports. :mod:`bench.planner.speed` runs it.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

PHASES = ("import_cli", "fake_tensor_mode", "model_library", "trace", "profile", "plan")


def phases(key: str, budget: int, gpu_name: str) -> dict[str, dict[str, float]]:
    """Time the CLI's work in phases, in this process (run it in a fresh one): wall and CPU seconds."""
    times: dict[str, dict[str, float]] = {"wall": {}, "cpu": {}}
    mark = time.perf_counter(), time.process_time()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter(), time.process_time()
        times["wall"][name] = now[0] - mark[0]
        times["cpu"][name] = now[1] - mark[1]
        mark = now

    cli = importlib.import_module("lightning_accudnn.cli")
    lap("import_cli")
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode()
    lap("fake_tensor_mode")
    from bench.planner.cases import CASES

    case = CASES[key]
    if case.model.startswith("torchvision:"):
        importlib.import_module("torchvision.models")
    else:
        importlib.import_module(case.model.partition(":")[0])
        importlib.import_module("transformers.modeling_utils")  # what the factory imports first
    spec = cli.resolve_model(case.model)
    lap("model_library")
    from lightning_accudnn.ops.layers import LayerTracker
    from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
    from lightning_accudnn.planner.plan import plan_swaps
    from lightning_accudnn.profiling.gpus import get_gpu
    from lightning_accudnn.profiling.trace import trace_step

    gpu = get_gpu(gpu_name)
    trace = trace_step(
        spec.builder(case.input_shape),
        (case.batch_size, *case.input_shape),
        tracker=LayerTracker(),
        input_dtype=cli.INPUT_DTYPES[case.input_dtype],
        dtype=case.dtype,
        gpu=gpu,
        meter=WorkingMemoryMeter,
    )
    lap("trace")
    profile = trace.to_profile(gpu)
    lap("profile")
    plan_swaps(profile, budget)
    lap("plan")
    return times


if __name__ == "__main__":
    print(json.dumps(phases(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
