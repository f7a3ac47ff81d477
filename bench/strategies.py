"""Memory strategies and the training loop that measures them, one result row per run.

Every strategy trains a fresh copy of the workload's model (same seed, same batches, same
device) in the same plain PyTorch loop; only how saved activations are kept differs:

* ``oracle``: nothing done, on the unconstrained device;
* ``accudnn``: lightning-accudnn's :class:`~lightning_accudnn.strategy.OffloadController`,
  the object ``AccUDNNStrategy`` delegates every hook to (budget, profiling step, planner,
  offload engine, re-planning), driven from this loop exactly as the strategy drives it;
* ``save_on_cpu``: ``torch.autograd.graph.save_on_cpu(pin_memory=True)``;
* ``torchtune``: torchtune's ``OffloadActivations`` when importable;
* ``checkpoint``: ``torch.utils.checkpoint`` around every block, ``use_reentrant=False``;
* ``compile``: ``torch.compile`` under ``torch._functorch.config.activation_memory_budget``;
* ``capped``: nothing done, under the same CUDA allocator cap AccUDNN sets (the deepest-model
  search's baseline).

A run that raises (out of memory, a budget too small, a backend that does not compile) is
a row with its status and error, never a crash of the harness.

Example:
    >>> from bench.workloads import tiny
    >>> config = RunConfig(device=torch.device("cpu"), warmup=1, steps=1)
    >>> row = run_strategy(tiny(), StrategySpec("oracle", "oracle"), config).row
    >>> row["status"], row["measured_steps"]
    ('ok', 1)
"""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.measure import PEAK_LEDGER, MemoryMeter, StepMemory, median, now, release_memory
from bench.workloads import Batch, Workload
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.planner import format_bytes
from lightning_accudnn.planner.plan import Plan, lower_bound_seconds
from lightning_accudnn.planner.static_memory import model_state_bytes
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES, StepProfile
from lightning_accudnn.strategy import OffloadController

#: Every field of a result row; a row has all of them (``None`` where not measured).
ROW_FIELDS = (
    "name",
    "strategy",
    "params",
    "status",
    "error_type",
    "error",
    "budget_bytes",
    "warmup_steps",
    "measured_steps",
    "steps_completed",
    "peak_source",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "warmup_peak_allocated_bytes",
    "rss_peak_delta_bytes",
    "ledger_peak_bytes",
    "peak_reduction",
    "median_step_seconds",
    "median_fwd_bwd_seconds",
    "median_optimizer_seconds",
    "samples_per_second",
    "step_seconds",
    "bytes_swapped_out",
    "bytes_swapped_in",
    "wait_seconds",
    "lower_bound_seconds",
    "bound_ratio",
    "lower_bound_source",
    "predicted_peak_bytes",
    "predicted_step_seconds",
    "engine_step_seconds",
    "engine_peak_bytes",
    "peak_vs_predicted",
    "time_vs_predicted",
    "profiling_steps_measured",
    "replans_during_measurement",
    "plan",
    "loss_first",
    "loss_last",
    "notes",
)


@dataclass(frozen=True)
class StrategySpec:
    """One row to run: its name, the strategy kind and the kind's parameters.

    Example:
        >>> StrategySpec("accudnn-2x", "accudnn", {"reduction": 2}).kind
        'accudnn'
    """

    name: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunConfig:
    """How every row of a run trains: device, steps, seed, AccUDNN and compile options.

    ``warmup`` steps run before the ``steps`` that are measured (AccUDNN's first step
    profiles and its second re-plans from its own timings, so at least 2 warm-up steps
    reach its steady state). ``distinct_batches`` batches are cycled.

    Example:
        >>> RunConfig(device=torch.device("cpu")).warmup
        3
    """

    device: torch.device
    warmup: int = 3
    steps: int = 10
    seed: int = 0
    distinct_batches: int = 2
    min_swap_bytes: int | None = None
    reserve_bytes: int | None = None
    host_memory_limit: str | None = None
    compile_backend: str = "inductor"


def empty_row(spec: StrategySpec, config: RunConfig) -> dict[str, Any]:
    """A row with every field, nothing measured yet.

    Example:
        >>> row = empty_row(StrategySpec("oracle", "oracle"), RunConfig(torch.device("cpu")))
        >>> set(row) == set(ROW_FIELDS), row["status"]
        (True, 'not run')
    """
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row.update(
        name=spec.name,
        strategy=spec.kind,
        params=dict(spec.params),
        status="not run",
        warmup_steps=config.warmup,
        measured_steps=0,
        steps_completed=0,
        notes=[],
    )
    return row


# -- techniques ---------------------------------------------------------------------------------


class Technique:
    """How one strategy changes a training step; the base class changes nothing (the oracle)."""

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        return model

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> StepMemory | None:
        """Run backward; return a peak measured inside it when the allocator was reset there."""
        loss.backward()
        return None

    def step_figures(self) -> dict[str, Any]:
        """Figures of the step just run (bytes swapped and the like)."""
        return {}

    def teardown(self) -> None:
        pass


class AccUDNN(Technique):
    """lightning-accudnn's controller under ``budget_bytes`` (what ``AccUDNNStrategy`` runs)."""

    def __init__(self, budget_bytes: int, config: RunConfig) -> None:
        min_swap = DEFAULT_MIN_SWAP_BYTES if config.min_swap_bytes is None else config.min_swap_bytes
        self.controller = OffloadController(
            budget=budget_bytes,
            min_swap_bytes=min_swap,
            host_memory_limit=config.host_memory_limit,
            reserve_bytes=config.reserve_bytes,
        )
        self.device = config.device
        self.last_plan: Plan | None = None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        self.controller.setup(device)
        return model

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        return self.controller.forward(model, [optimizer], batch)

    def backward(self, loss: torch.Tensor) -> StepMemory | None:
        self.controller.begin_backward()
        try:
            loss.backward()
        except BaseException:
            self.controller.abort()
            raise
        stats = self.controller.end_step()
        if stats is None or self.device.type != "cuda":
            return None
        # end_step read the allocator's peak of forward and backward, then reset it.
        return StepMemory(stats.peak_device_bytes, stats.peak_reserved_bytes)

    def step_figures(self) -> dict[str, Any]:
        stats = self.controller.stats
        if stats is None:
            return {}
        return {
            "bytes_swapped_out": stats.bytes_swapped_out,
            "bytes_swapped_in": stats.bytes_swapped_in,
            "wait_seconds": stats.wait_seconds,
            "ledger_peak_bytes": stats.ledger_peak_bytes,
            "engine_peak_bytes": stats.peak_device_bytes,
            "engine_step_seconds": stats.step_seconds,
            "profiling": stats.profiling,
            "predicted_peak_bytes": stats.predicted_peak_bytes,
            "predicted_step_seconds": stats.predicted_step_seconds,
            "plan_id": id(self.controller.plan),
        }

    @property
    def plan(self) -> Plan | None:
        return self.controller.plan

    def teardown(self) -> None:
        self.controller.teardown()


class Capped(Technique):
    """No offload, with the CUDA caching allocator capped at ``budget_bytes`` (as AccUDNN caps it).

    For the deepest-model search's baseline; on CPU there is nothing to cap, so it refuses.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.device: torch.device | None = None

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        if device.type != "cuda":
            raise RuntimeError("a memory cap without offload needs CUDA (the CPU has no allocator cap)")
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, self.budget_bytes / total), device)
        self.device = device
        return model

    def teardown(self) -> None:
        if self.device is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            self.device = None


class _CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """``save_on_cpu`` itself, with its hooks wrapped to count the bytes they copy."""

    def __init__(self, pin_memory: bool) -> None:
        super().__init__(pin_memory=pin_memory)
        self.bytes_out = 0
        self.bytes_in = 0
        pack, unpack = self.pack_hook, self.unpack_hook

        def counting_pack(tensor: torch.Tensor) -> Any:
            self.bytes_out += tensor.numel() * tensor.element_size()
            return pack(tensor)

        def counting_unpack(packed: Any) -> torch.Tensor:
            tensor = unpack(packed)
            self.bytes_in += tensor.numel() * tensor.element_size()
            return tensor

        self.pack_hook, self.unpack_hook = counting_pack, counting_unpack


class SaveOnCpu(Technique):
    """``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around forward.

    Called as PyTorch documents it (``device_type`` left at its default ``"cuda"``): on a
    machine without CUDA it copies every saved tensor to plain, unpinned host memory.
    """

    def __init__(self, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory
        self.hooks: _CountingSaveOnCpu | None = None

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        self.hooks = _CountingSaveOnCpu(self.pin_memory)
        return self.hooks

    def step_figures(self) -> dict[str, Any]:
        if self.hooks is None:
            return {}
        return {"bytes_swapped_out": self.hooks.bytes_out, "bytes_swapped_in": self.hooks.bytes_in}


class TorchtuneOffload(Technique):
    """torchtune's ``OffloadActivations`` (pinned memory, streams) around forward."""

    def __init__(self) -> None:
        from torchtune.training import OffloadActivations  # ImportError: the row says "not installed"

        self.factory = OffloadActivations

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        return self.factory(use_pin_memory=True)


class _Checkpointed(nn.Module):
    """Runs ``block`` under ``torch.utils.checkpoint`` (non-reentrant)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module, names: list[str]) -> nn.Module:
    """Replace each named block of ``model`` by a checkpointed wrapper (in place).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> type(checkpoint_blocks(model, ["1"])[1]).__name__
        '_Checkpointed'
    """
    if not names:
        raise ValueError("the workload names no blocks to checkpoint")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _Checkpointed(parent.get_submodule(child)))
    return model


class Checkpoint(Technique):
    """Full activation checkpointing: every block of the workload recomputed in backward."""

    def __init__(self, block_names: list[str]) -> None:
        self.block_names = block_names

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        return checkpoint_blocks(model, self.block_names)


class Compile(Technique):
    """``torch.compile(model, backend=...)`` with ``activation_memory_budget`` set while it runs."""

    def __init__(self, activation_memory_budget: float, backend: str) -> None:
        import torch._functorch.config as functorch_config

        self.backend = backend
        self.patch = functorch_config.patch(activation_memory_budget=activation_memory_budget)
        self.patched = False

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        self.patch.__enter__()
        self.patched = True
        return torch.compile(model, backend=self.backend)

    def teardown(self) -> None:
        if self.patched:
            self.patch.__exit__(None, None, None)
            self.patched = False
        import torch._dynamo

        torch._dynamo.reset()


# -- the loop -----------------------------------------------------------------------------------


def _autocast(workload: Workload, device: torch.device) -> contextlib.AbstractContextManager:
    if workload.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _to_device(batch: Batch, device: torch.device) -> Batch:
    first, second = batch
    return first.to(device, non_blocking=True), second.to(device, non_blocking=True)


@contextlib.contextmanager
def _row_errors(row: dict[str, Any]) -> Iterator[None]:
    """Record an exception as the row's status instead of raising it."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except Exception as error:
        row["status"] = "oom" if isinstance(error, torch.OutOfMemoryError) else "failed"
        row["error_type"] = type(error).__name__
        row["error"] = str(error).strip().splitlines()[0][:500] if str(error).strip() else repr(error)
        row["traceback"] = traceback.format_exc(limit=8)


def _technique(
    spec: StrategySpec, model: nn.Module, workload: Workload, config: RunConfig, row: dict[str, Any]
) -> Technique:
    kind, params = spec.kind, spec.params
    if kind == "checkpoint":
        return Checkpoint(workload.blocks(model))
    if kind == "oracle":
        return Technique()
    if kind == "accudnn":
        budget = params.get("budget_bytes")
        if budget is None:
            raise ValueError("an accudnn row needs budget_bytes")
        row["budget_bytes"] = int(budget)
        return AccUDNN(int(budget), config)
    if kind == "capped":
        row["budget_bytes"] = int(params["budget_bytes"])
        return Capped(int(params["budget_bytes"]))
    if kind == "save_on_cpu":
        return SaveOnCpu(pin_memory=params.get("pin_memory", True))
    if kind == "torchtune":
        return TorchtuneOffload()
    if kind == "compile":
        return Compile(
            float(params["activation_memory_budget"]), params.get("backend", config.compile_backend)
        )
    raise ValueError(f"unknown strategy kind {kind!r}")


@dataclass
class RunResult:
    """A row (plain data for the JSON) and, for AccUDNN, the profile its plan was made from."""

    row: dict[str, Any]
    profile: StepProfile | None = None


def run_strategy(workload: Workload, spec: StrategySpec, config: RunConfig) -> RunResult:
    """Train ``workload`` under ``spec`` for ``config.warmup + config.steps`` steps; one row.

    An AccUDNN row gets its lower bound from the profile its own plan was made from; the
    others get theirs later from :func:`fill_lower_bound`.

    Example:
        >>> from bench.workloads import tiny
        >>> result = run_strategy(tiny(), StrategySpec("ckpt", "checkpoint"),
        ...                       RunConfig(torch.device("cpu"), warmup=1, steps=1))
        >>> result.row["status"], result.row["bytes_swapped_out"]
        ('ok', 0)
    """
    device = config.device
    row = empty_row(spec, config)
    if spec.kind == "torchtune":
        try:
            import torchtune.training  # noqa: F401
        except ImportError as error:
            row.update(status="not_installed", error_type=type(error).__name__, error=str(error))
            return RunResult(row)
    meter = MemoryMeter(device)
    meter.start_run()
    holder: dict[str, Technique] = {}
    per_step: list[dict[str, Any]] = []
    with _row_errors(row):
        _train(workload, spec, config, row, meter, holder, per_step)
        row["status"] = "ok"
    technique = holder.get("technique")
    _summarize(row, per_step, config, workload, meter, technique)
    profile = profile_of(technique)
    if technique is not None:
        with _row_errors(row):
            technique.teardown()
    holder.clear()
    technique = None
    release_memory(device)
    return RunResult(row, profile)


def _train(
    workload: Workload,
    spec: StrategySpec,
    config: RunConfig,
    row: dict[str, Any],
    meter: MemoryMeter,
    holder: dict[str, Technique],
    per_step: list[dict[str, Any]],
) -> None:
    """The training loop of one row (its own frame: on a failure the model dies with it)."""
    device = config.device
    torch.manual_seed(config.seed)
    with torch.device(device):
        model = workload.build()
    optimizer = workload.optimizer(model)
    technique = holder["technique"] = _technique(spec, model, workload, config, row)
    model = technique.prepare(model, optimizer, device)
    batches = [workload.make_batch(i) for i in range(config.distinct_batches)]
    if device.type == "cuda":
        batches = [(a.pin_memory(), b.pin_memory()) for a, b in batches]
    for index in range(config.warmup + config.steps):
        batch = _to_device(batches[index % len(batches)], device)
        meter.start_step()
        start = now(device)
        with technique.forward_context(model, optimizer, batch), _autocast(workload, device):
            loss = workload.loss(model, batch)
        inner_peak = technique.backward(loss)
        middle = now(device)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = now(device)
        memory = meter.end_step(inner_peak)
        per_step.append(
            {
                "step_seconds": end - start,
                "fwd_bwd_seconds": middle - start,
                "optimizer_seconds": end - middle,
                "allocated": memory.allocated,
                "reserved": memory.reserved,
                "loss": float(loss.detach()),
                **technique.step_figures(),
            }
        )
        row["steps_completed"] = index + 1
        del loss, batch
    if spec.kind == "oracle" and device.type == "cpu":
        row["ledger_peak_bytes"] = _ledger_peak(workload, model, optimizer, batches[0], device, config)


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
    batch = _to_device(batch, device)
    with (
        engine.offload(
            model, SwapSchedule.keep_everything(), static_bytes=model_state_bytes(model, [optimizer])
        ),
        _autocast(workload, device),
    ):
        loss = workload.loss(model, batch)
    loss.backward()
    stats = engine.end_step()
    optimizer.zero_grad(set_to_none=True)
    engine.close()
    return stats.ledger_peak_bytes if stats is not None else 0


def _summarize(
    row: dict[str, Any],
    per_step: list[dict[str, Any]],
    config: RunConfig,
    workload: Workload,
    meter: MemoryMeter,
    technique: Technique | None,
) -> None:
    """Fill the row's figures from the steps that ran (the measured ones after warm-up)."""
    row["step_seconds"] = [step["step_seconds"] for step in per_step]
    if per_step:
        row["loss_first"] = per_step[0]["loss"]
        row["loss_last"] = per_step[-1]["loss"]
    warm, measured = per_step[: config.warmup], per_step[config.warmup :]
    row["measured_steps"] = len(measured)
    row["peak_source"] = meter.peak_source
    accudnn = isinstance(technique, AccUDNN)
    peak_key = "ledger_peak_bytes" if accudnn and config.device.type == "cpu" else "allocated"
    warm_peaks = [step[peak_key] for step in warm if step.get(peak_key) is not None]
    if warm_peaks:
        row["warmup_peak_allocated_bytes"] = max(warm_peaks)
    if not meter.rss_peak_resettable:
        row["notes"].append("/proc/self/clear_refs not writable: RSS peaks are the process's high-water mark")
    if accudnn and config.device.type == "cpu":
        row["peak_source"] = PEAK_LEDGER
    if not measured:
        return
    row["peak_allocated_bytes"] = max(step["allocated"] for step in measured)
    reserved = [step["reserved"] for step in measured if step["reserved"] is not None]
    row["peak_reserved_bytes"] = max(reserved) if reserved else None
    if config.device.type == "cpu":
        row["rss_peak_delta_bytes"] = row["peak_allocated_bytes"]
        if accudnn:
            row["peak_allocated_bytes"] = max(step["ledger_peak_bytes"] for step in measured)
    row["median_step_seconds"] = median([step["step_seconds"] for step in measured])
    row["median_fwd_bwd_seconds"] = median([step["fwd_bwd_seconds"] for step in measured])
    row["median_optimizer_seconds"] = median([step["optimizer_seconds"] for step in measured])
    row["samples_per_second"] = workload.samples / row["median_step_seconds"]
    if "bytes_swapped_out" in measured[0]:
        row["bytes_swapped_out"] = int(median([step["bytes_swapped_out"] for step in measured]))
        row["bytes_swapped_in"] = int(median([step["bytes_swapped_in"] for step in measured]))
    elif row["strategy"] in ("oracle", "checkpoint", "compile"):
        row["bytes_swapped_out"] = row["bytes_swapped_in"] = 0
    if accudnn:
        assert isinstance(technique, AccUDNN)
        _summarize_accudnn(row, measured, technique)
    if row["lower_bound_seconds"]:
        row["bound_ratio"] = row["median_fwd_bwd_seconds"] / row["lower_bound_seconds"]


def fill_lower_bound(row: dict[str, Any], source: str, profile: StepProfile, device: torch.device) -> None:
    """The lower bound of a row that measured no profile, from an AccUDNN row's profile.

    The oracle's bound is the profile's compute time (nothing must leave the device). The
    others' is the bound for a budget equal to their own measured peak, on CUDA only: on
    CPU their peak is a resident-set delta, which the profile's ledger bytes do not compare with.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 100, 100, 1.0, 2.0),), static_bytes=0)
        >>> row = {"strategy": "oracle", "status": "ok", "median_fwd_bwd_seconds": 3.3}
        >>> fill_lower_bound(row, "accudnn-2x", profile, torch.device("cpu"))
        >>> row["lower_bound_seconds"], round(row["bound_ratio"], 2)
        (3.0, 1.1)
    """
    if row.get("status") != "ok" or row.get("strategy") == "accudnn" or not row.get("median_fwd_bwd_seconds"):
        return
    if row["strategy"] == "oracle":
        budget = profile.unconstrained_peak_bytes
        row["lower_bound_source"] = f"profile measured by {source}, nothing swapped"
    elif device.type == "cuda" and row.get("peak_allocated_bytes"):
        budget = row["peak_allocated_bytes"]
        row["lower_bound_source"] = f"profile measured by {source}, budget = this row's peak"
    else:
        row["lower_bound_source"] = "none on CPU: this row's peak is a resident-set delta, not ledger bytes"
        return
    row["lower_bound_seconds"] = lower_bound_seconds(profile, budget)
    if row["lower_bound_seconds"] > 0:
        row["bound_ratio"] = row["median_fwd_bwd_seconds"] / row["lower_bound_seconds"]


def _summarize_accudnn(row: dict[str, Any], measured: list[dict[str, Any]], technique: AccUDNN) -> None:
    row["wait_seconds"] = median([step["wait_seconds"] for step in measured])
    row["ledger_peak_bytes"] = max(step["ledger_peak_bytes"] for step in measured)
    row["engine_peak_bytes"] = max(step["engine_peak_bytes"] for step in measured)
    row["engine_step_seconds"] = median([step["engine_step_seconds"] for step in measured])
    row["profiling_steps_measured"] = sum(1 for step in measured if step["profiling"])
    plan_ids = [step["plan_id"] for step in measured]
    row["replans_during_measurement"] = sum(1 for a, b in zip(plan_ids, plan_ids[1:], strict=False) if a != b)
    last = measured[-1]
    row["predicted_peak_bytes"] = last["predicted_peak_bytes"]
    row["predicted_step_seconds"] = last["predicted_step_seconds"]
    if row["predicted_peak_bytes"]:
        row["peak_vs_predicted"] = row["engine_peak_bytes"] / row["predicted_peak_bytes"]
    if row["predicted_step_seconds"]:
        row["time_vs_predicted"] = row["engine_step_seconds"] / row["predicted_step_seconds"]
    plan = technique.plan
    if plan is not None:
        row["lower_bound_seconds"] = lower_bound_seconds(plan.profile, plan.budget_bytes)
        row["lower_bound_source"] = "profile measured by this row, its budget"
        row["plan"] = {
            "swapped_layers": len(plan.swapped_layers),
            "layers": len(plan.profile.layers),
            "swapped_bytes": plan.swapped_bytes,
            "saved_bytes": plan.profile.saved_bytes,
            "static_bytes": plan.profile.static_bytes,
            "reserve_bytes": plan.reserve_bytes,
            "prefetch_window_bytes": plan.prefetch_window_bytes,
            "min_budget_bytes": plan.min_budget_bytes,
            "search": plan.search,
            "planner_bound_ratio": plan.bound_ratio if math.isfinite(plan.bound_ratio) else None,
            "d2h_bytes_per_second": _finite(plan.profile.d2h_bytes_per_second),
            "h2d_bytes_per_second": _finite(plan.profile.h2d_bytes_per_second),
        }
        if row["profiling_steps_measured"]:
            row["notes"].append(
                f"{row['profiling_steps_measured']} measured step(s) were profiling steps (swap everything)"
            )
        if row["budget_bytes"] is not None and row["peak_allocated_bytes"] > row["budget_bytes"]:
            row["notes"].append(
                f"measured peak {format_bytes(row['peak_allocated_bytes'])} is over the budget "
                f"{format_bytes(row['budget_bytes'])}"
            )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def profile_of(technique: Technique | None) -> StepProfile | None:
    """The profile an AccUDNN technique planned from (``None`` for the others)."""
    if isinstance(technique, AccUDNN) and technique.plan is not None:
        return technique.plan.profile
    return None
