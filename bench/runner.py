"""The training loop every row runs, and how a row's figures are summarised from its steps.

Every strategy trains a fresh copy of the workload's model (same seed, same batches, same
device) in the same plain PyTorch loop; only the technique (:mod:`bench.techniques`)
differs. A run that raises (out of memory, a budget too small, a backend that does not
compile) is a row with its status and error, never a crash of the harness.

Example:
    >>> from bench.workloads import tiny
    >>> config = RunConfig(device=torch.device("cpu"), warmup=1, steps=1)
    >>> row = run_strategy(tiny(), StrategySpec("oracle", "oracle"), config).row
    >>> row.status, row.measured_steps
    ('ok', 1)
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.config import RunConfig, StrategySpec
from bench.host_profile import profile_host
from bench.measure import (
    PEAK_LEDGER,
    MemoryMeter,
    StepMemory,
    allocator_counters,
    counter_increase,
    median,
    now,
    release_memory,
    synchronize,
)
from bench.row import ResultRow
from bench.streams import profile_streams
from bench.techniques import AccUDNN, Technique, budget_of, make_technique
from bench.workloads import Batch, Workload
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.planner import format_bytes, lower_bound_seconds
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES, StepProfile
from lightning_accudnn.profiling.static_memory import model_state_bytes

#: Steps each row runs under ``cProfile`` after the measured ones (on CUDA, after the one under
#: ``torch.profiler``): two, since the rows' batches alternate.
HOST_PROFILED_STEPS = 2


def empty_row(spec: StrategySpec, config: RunConfig) -> ResultRow:
    """A row with every field, nothing measured yet.

    Example:
        >>> row = empty_row(StrategySpec("oracle", "oracle"), RunConfig(torch.device("cpu")))
        >>> row.status, row.warmup_steps
        ('not run', 3)
    """
    return ResultRow(name=spec.name, strategy=spec.kind, params=dict(spec.params), warmup_steps=config.warmup)


def autocast_for(workload: Workload, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast to bfloat16 around forward and loss for a bf16 workload; nothing for fp32."""
    if workload.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batch_on(batch: Batch, device: torch.device) -> Batch:
    """``batch`` on ``device`` (copied without blocking from pinned memory)."""
    first, second = batch
    return first.to(device, non_blocking=True), second.to(device, non_blocking=True)


@contextlib.contextmanager
def _row_errors(row: ResultRow) -> Iterator[None]:
    """Record an exception as the row's status instead of raising it."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except Exception as error:
        row.status = "oom" if isinstance(error, torch.OutOfMemoryError) else "failed"
        row.error_type = type(error).__name__
        row.error = str(error).strip().splitlines()[0][:500] if str(error).strip() else repr(error)
        row.traceback = traceback.format_exc(limit=8)


@dataclass
class RunResult:
    """A row and, for AccUDNN, the profile its plan was made from."""

    row: ResultRow
    profile: StepProfile | None = None


def run_strategy(workload: Workload, spec: StrategySpec, config: RunConfig) -> RunResult:
    """Train ``workload`` under ``spec`` for ``config.warmup + config.steps`` steps; one row.

    An AccUDNN row gets its lower bound from the profile its own plan was made from; the
    others get theirs later from :func:`fill_lower_bound`.

    Example:
        >>> from bench.workloads import tiny
        >>> result = run_strategy(tiny(), StrategySpec("ckpt", "checkpoint"),
        ...                       RunConfig(torch.device("cpu"), warmup=1, steps=1))
        >>> result.row.status, result.row.bytes_swapped_out
        ('ok', 0)
    """
    device = config.device
    row = empty_row(spec, config)
    if spec.kind == "torchtune":
        try:
            import torchtune.training  # noqa: F401
        except ImportError as error:
            row.status, row.error_type, row.error = "not_installed", type(error).__name__, str(error)
            return RunResult(row)
    meter = MemoryMeter(device)
    meter.start_run()
    holder: dict[str, Technique] = {}
    per_step: list[dict[str, Any]] = []
    extra: list[Callable[[], dict[str, Any]]] = []
    with _row_errors(row):
        _train(workload, spec, config, row, meter, holder, per_step, extra)
        row.status = "ok"
    technique = holder.get("technique")
    _summarize(row, per_step, config, workload, meter, technique)
    profile = profile_of(technique)
    if extra:
        step = extra.pop()
        if device.type == "cuda":
            _profile_streams(row, step, per_step[-1] if per_step else {})
        _profile_host(row, step)
    if technique is not None:
        with _row_errors(row):
            technique.teardown()
    holder.clear()
    technique = None
    release_memory(device)
    return RunResult(row, profile)


def _forward_backward(
    technique: Technique,
    workload: Workload,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    device: torch.device,
) -> tuple[torch.Tensor, StepMemory | None]:
    """One forward and backward (its own frame: a failed pass's tensors go with it); the loss,
    detached, and the peak measured inside backward."""
    with technique.forward_context(model, optimizer, batch), autocast_for(workload, device):
        loss = workload.loss(model, batch)
    return loss.detach(), technique.backward(loss)


def _step(
    technique: Technique,
    workload: Workload,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    device: torch.device,
    row: ResultRow,
    label: str,
) -> dict[str, Any]:
    """One training step, timed (the device synchronised at each mark): forward and backward,
    run again where the technique recovers from its error, then the optimizer step. Its times,
    the host's time to issue forward and backward (read before the device is synchronised: near
    their wall time, the step waits for the host), loss and the peak measured inside backward
    (``inner_peak``)."""
    start = now(device)
    while True:
        try:
            loss, inner_peak = _forward_backward(technique, workload, model, optimizer, batch, device)
            break
        except BaseException as error:
            if not technique.recover(error):
                raise
            row.notes.append(f"{label}: {type(error).__name__}, re-planned and run again")
        # The error and the frames of the failed pass are gone: what only they held can go too.
        optimizer.zero_grad(set_to_none=True)
        technique.release_failed_pass()
    issued = time.perf_counter()
    middle = now(device)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    end = now(device)
    return {
        "step_seconds": end - start,
        "fwd_bwd_seconds": middle - start,
        "fwd_bwd_issue_seconds": issued - start,
        "optimizer_seconds": end - middle,
        "loss": float(loss),
        "inner_peak": inner_peak,
    }


def _train(
    workload: Workload,
    spec: StrategySpec,
    config: RunConfig,
    row: ResultRow,
    meter: MemoryMeter,
    holder: dict[str, Technique],
    per_step: list[dict[str, Any]],
    extra: list[Callable[[], dict[str, Any]]],
) -> None:
    """The training loop of one row (its own frame: on a failure the model dies with it). It
    leaves in ``extra`` one more step to profile, run after the row is summarised."""
    device = config.device
    torch.manual_seed(config.seed)
    with torch.device(device):
        model = workload.build()
    optimizer = workload.optimizer(model)
    row.static_bytes = model_state_bytes(model, [optimizer])
    row.budget_bytes = budget_of(spec)
    technique = holder["technique"] = make_technique(spec, model, workload, config)
    model = technique.prepare(model, optimizer, device)
    batches = [workload.make_batch(i) for i in range(config.distinct_batches)]
    if device.type == "cuda":
        batches = [(a.pin_memory(), b.pin_memory()) for a, b in batches]
    warmup = config.warmup
    index = 0
    while index < warmup + config.steps:
        batch = batch_on(batches[index % len(batches)], device)
        meter.start_step()
        counters = allocator_counters(device)
        figures = _step(technique, workload, model, optimizer, batch, device, row, f"step {index}")
        memory = meter.end_step(figures.pop("inner_peak"))
        per_step.append(
            {
                **figures,
                "allocated": memory.allocated,
                "reserved": memory.reserved,
                "allocator_calls": counter_increase(counters, allocator_counters(device)),
                **technique.step_figures(),
            }
        )
        row.steps_completed = index + 1
        del batch
        if index + 1 == warmup:
            if technique.settled() or warmup == 2 * config.warmup:
                row.warmup_steps = warmup
            else:  # a plan still being refined: the measured steps must not include it
                warmup += 1
        index += 1
    if config.steps > 0:
        batch = batch_on(batches[index % len(batches)], device)
        synchronize(device)  # the batch's copy is not the profiled step's

        def profiled_step() -> dict[str, Any]:
            figures = _step(technique, workload, model, optimizer, batch, device, row, "profiled step")
            figures.pop("inner_peak")
            return {**figures, **technique.step_figures()}

        extra.append(profiled_step)
    if spec.kind == "oracle" and device.type == "cpu":
        row.ledger_peak_bytes = _ledger_peak(workload, model, optimizer, batches[0], device, config)


def _profile_streams(row: ResultRow, step: Callable[[], dict[str, Any]], last: dict[str, Any]) -> None:
    """``row.streams``: where one more step's time went on the device, stream by stream
    (:func:`bench.streams.profile_streams`), and that step's own figures (``step``: its times and
    the technique's, as the measured steps record them; ``same_plan``, for AccUDNN, whether it ran
    the plan of the ``last`` measured step). It runs after the row's other figures are summarised.
    A profiled step that fails leaves a note and no figures."""
    figures: dict[str, Any] = {}

    def run() -> float:
        figures.update(step())
        return float(figures["step_seconds"])

    try:
        streams = profile_streams(run)
    except Exception as error:
        row.notes.append(f"profiled step: {type(error).__name__}: {error}"[:500])
        return
    if "plan_id" in figures:
        figures["same_plan"] = figures.pop("plan_id") == last.get("plan_id")
    row.streams = {**streams, "step": figures}


def _profile_host(row: ResultRow, step: Callable[[], dict[str, Any]]) -> None:
    """``row.host_profile``: where the host's time went in :data:`HOST_PROFILED_STEPS` more
    steps, function by function (:func:`bench.host_profile.profile_host`), run after the streams'
    step. A step that fails leaves a note and no figures."""
    try:
        row.host_profile = profile_host(step, steps=HOST_PROFILED_STEPS)
    except Exception as error:
        row.notes.append(f"host-profiled steps: {type(error).__name__}: {error}"[:500])


def _ledger_peak(
    workload: Workload,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    device: torch.device,
    config: RunConfig,
) -> int:
    """The oracle's peak as AccUDNN's CPU ledger counts it: model state plus every saved activation.

    One extra, untimed step through the offload engine keeping everything on the device
    (the ledger is the only memory a CPU budget bounds).
    """
    min_swap = DEFAULT_MIN_SWAP_BYTES if config.min_swap_bytes is None else config.min_swap_bytes
    engine = OffloadEngine(device, min_swap_bytes=min_swap)
    batch = batch_on(batch, device)
    with (
        engine.offload(
            model, SwapSchedule.keep_everything(), static_bytes=model_state_bytes(model, [optimizer])
        ),
        autocast_for(workload, device),
    ):
        loss = workload.loss(model, batch)
    loss.backward()
    stats = engine.end_step()
    optimizer.zero_grad(set_to_none=True)
    engine.close()
    return stats.ledger_peak_bytes if stats is not None else 0


def _summarize(
    row: ResultRow,
    per_step: list[dict[str, Any]],
    config: RunConfig,
    workload: Workload,
    meter: MemoryMeter,
    technique: Technique | None,
) -> None:
    """Fill the row's figures from the steps that ran (the measured ones after warm-up)."""
    row.step_seconds = [step["step_seconds"] for step in per_step]
    if per_step:
        row.loss_first = per_step[0]["loss"]
        row.loss_last = per_step[-1]["loss"]
    warmup = config.warmup if row.warmup_steps is None else row.warmup_steps
    warm, measured = per_step[:warmup], per_step[warmup:]
    if warmup > config.warmup:
        row.notes.append(f"warm-up ran {warmup} steps ({config.warmup} asked): the technique had not settled")
    row.measured_steps = len(measured)
    row.peak_source = meter.peak_source
    accudnn = isinstance(technique, AccUDNN)
    peak_key = "ledger_peak_bytes" if accudnn and config.device.type == "cpu" else "allocated"
    warm_peaks = [step[peak_key] for step in warm if step.get(peak_key) is not None]
    if warm_peaks:
        row.warmup_peak_allocated_bytes = max(warm_peaks)
    if not meter.rss_peak_resettable:
        row.notes.append("/proc/self/clear_refs not writable: RSS peaks are the process's high-water mark")
    if accudnn and config.device.type == "cpu":
        row.peak_source = PEAK_LEDGER
    if not measured:
        return
    row.peak_allocated_bytes = max(step["allocated"] for step in measured)
    reserved = [step["reserved"] for step in measured if step["reserved"] is not None]
    row.peak_reserved_bytes = max(reserved) if reserved else None
    if config.device.type == "cpu":
        row.rss_peak_delta_bytes = row.peak_allocated_bytes
        if accudnn:
            row.peak_allocated_bytes = max(step["ledger_peak_bytes"] for step in measured)
    row.median_step_seconds = median([step["step_seconds"] for step in measured])
    row.median_fwd_bwd_seconds = median([step["fwd_bwd_seconds"] for step in measured])
    row.median_fwd_bwd_issue_seconds = median([step["fwd_bwd_issue_seconds"] for step in measured])
    row.median_optimizer_seconds = median([step["optimizer_seconds"] for step in measured])
    if config.device.type == "cuda":
        calls = [step["allocator_calls"] for step in measured]
        row.allocator_calls_per_step = {
            name: sum(step[name] for step in calls) / len(calls) for name in calls[0]
        }
    assert row.median_step_seconds is not None
    row.samples_per_second = workload.samples / row.median_step_seconds
    if "bytes_swapped_out" in measured[0]:
        row.bytes_swapped_out = int(median([step["bytes_swapped_out"] for step in measured]) or 0)
        row.bytes_swapped_in = int(median([step["bytes_swapped_in"] for step in measured]) or 0)
    elif row.strategy in ("oracle", "checkpoint", "compile"):
        row.bytes_swapped_out = row.bytes_swapped_in = 0
    if isinstance(technique, AccUDNN):
        row.graph_changed_steps = sum(1 for step in per_step if step.get("graph_changed"))
        if row.graph_changed_steps:
            row.notes.append(
                f"{row.graph_changed_steps} step(s) replayed a sequence their graph departed from "
                "(each then ran hooked and was planned from)"
            )
        _summarize_accudnn(row, measured, technique)
    if row.lower_bound_seconds and row.median_fwd_bwd_seconds is not None:
        row.bound_ratio = row.median_fwd_bwd_seconds / row.lower_bound_seconds


def fill_lower_bound(row: ResultRow, source: str, profile: StepProfile, device: torch.device) -> None:
    """The lower bound of a row that measured no profile, from an AccUDNN row's profile.

    The oracle's bound is the profile's compute time (nothing must leave the device). The
    others' is the bound for a budget equal to their own measured peak, on CUDA only: on
    CPU their peak is a resident-set delta, which the profile's ledger bytes do not compare with.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 100, 100, 1.0, 2.0),), static_bytes=0)
        >>> row = ResultRow("oracle", "oracle", status="ok", median_fwd_bwd_seconds=3.3)
        >>> fill_lower_bound(row, "accudnn-2x", profile, torch.device("cpu"))
        >>> row.lower_bound_seconds, round(row.bound_ratio, 2)
        (3.0, 1.1)
    """
    if row.status != "ok" or row.strategy == "accudnn" or not row.median_fwd_bwd_seconds:
        return
    if row.strategy == "oracle":
        budget = profile.unconstrained_peak_bytes
        row.lower_bound_source = f"profile measured by {source}, nothing swapped"
    elif device.type == "cuda" and row.peak_allocated_bytes:
        budget = row.peak_allocated_bytes
        row.lower_bound_source = f"profile measured by {source}, budget = this row's peak"
    else:
        row.lower_bound_source = "none on CPU: this row's peak is a resident-set delta, not ledger bytes"
        return
    row.lower_bound_seconds = lower_bound_seconds(profile, budget, "auto")
    if row.lower_bound_seconds > 0:
        row.bound_ratio = row.median_fwd_bwd_seconds / row.lower_bound_seconds


def _summarize_accudnn(row: ResultRow, measured: list[dict[str, Any]], technique: AccUDNN) -> None:
    row.wait_seconds = median([step["wait_seconds"] for step in measured])
    row.ledger_peak_bytes = max(step["ledger_peak_bytes"] for step in measured)
    row.engine_peak_bytes = max(step["engine_peak_bytes"] for step in measured)
    row.engine_step_seconds = median([step["engine_step_seconds"] for step in measured])
    row.engine_forward_seconds = median([step["engine_forward_seconds"] for step in measured])
    row.engine_backward_seconds = median([step["engine_backward_seconds"] for step in measured])
    engine_host = [
        step["storages_swapped_out"] * step["host_seconds_per_swapped_storage"]
        for step in measured
        if step["host_seconds_per_swapped_storage"] is not None
    ]
    row.engine_host_seconds = median(engine_host) if engine_host else None
    row.profiling_steps_measured = sum(1 for step in measured if step["profiling"])
    plan_ids = [step["plan_id"] for step in measured]
    row.replans_during_measurement = sum(1 for a, b in zip(plan_ids, plan_ids[1:], strict=False) if a != b)
    last = measured[-1]
    row.predicted_peak_bytes = last["predicted_peak_bytes"]
    row.predicted_step_seconds = last["predicted_step_seconds"]
    if row.predicted_peak_bytes:
        row.peak_vs_predicted = row.engine_peak_bytes / row.predicted_peak_bytes
    if row.predicted_step_seconds and row.engine_step_seconds is not None:
        row.time_vs_predicted = row.engine_step_seconds / row.predicted_step_seconds
    plan = technique.plan
    if plan is None:
        return
    row.lower_bound_seconds = lower_bound_seconds(plan.profile, plan.budget_bytes, plan.policy)
    row.lower_bound_source = "profile measured by this row, its budget"
    timeline = plan.timeline
    row.plan = {
        "swapped_layers": len(plan.swapped_layers),
        "layers": len(plan.profile.layers),
        "swapped_bytes": plan.swapped_bytes,
        "saved_bytes": plan.profile.saved_bytes,
        "static_bytes": plan.profile.static_bytes,
        "reserve_bytes": plan.reserve_bytes,
        "prefetch_window_bytes": plan.prefetch_window_bytes,
        "min_budget_bytes": plan.min_budget_bytes,
        "search": plan.search,
        "policy": plan.policy,
        "recomputed_segments": list(plan.recomputed),
        "recompute_seconds": plan.recompute_seconds,
        "predicted_forward_seconds": None if timeline is None else timeline.forward_seconds,
        "predicted_compute_wait_seconds": None if timeline is None else timeline.compute_wait_seconds,
        "planner_bound_ratio": plan.bound_ratio if math.isfinite(plan.bound_ratio) else None,
        "d2h_bytes_per_second": _finite(plan.profile.d2h_bytes_per_second),
        "h2d_bytes_per_second": _finite(plan.profile.h2d_bytes_per_second),
    }
    if row.profiling_steps_measured:
        row.notes.append(
            f"{row.profiling_steps_measured} measured step(s) were profiling steps (swap everything)"
        )
    peak = row.peak_allocated_bytes
    if row.budget_bytes is not None and peak is not None and peak > row.budget_bytes:
        row.notes.append(
            f"measured peak {format_bytes(peak)} is over the budget {format_bytes(row.budget_bytes)}"
        )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def profile_of(technique: Technique | None) -> StepProfile | None:
    """The profile an AccUDNN technique planned from (``None`` for the others)."""
    if isinstance(technique, AccUDNN) and technique.plan is not None:
        return technique.plan.profile
    return None
