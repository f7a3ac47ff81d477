"""The offload logic every AccUDNN strategy shares: budget, profile, plan, engine, stats.

One :class:`OffloadController` lives in each strategy (single device and DDP) and is driven
from the strategy's hooks: :meth:`setup`, :meth:`forward` around the training step,
:meth:`begin_backward` / :meth:`end_step` around backward, :meth:`abort` on failure and
:meth:`teardown`.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.utils._pytree import tree_flatten

from lightning_accudnn.ops import HostMemoryExceeded, OffloadEngine, StepStats, SwapSchedule
from lightning_accudnn.planner import Budget, StepProfile, format_bytes
from lightning_accudnn.planner.bandwidth import host_link
from lightning_accudnn.planner.coordination import RankCoordinator
from lightning_accudnn.planner.plan import Plan, copying_out_limit, plan_swaps
from lightning_accudnn.planner.static_memory import model_state_bytes
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES

log = logging.getLogger(__name__)

#: Share of system RAM the pinned pool may take unless told otherwise.
DEFAULT_HOST_MEMORY_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class OffloadStats:
    """Figures of the last training step, kept on the strategy as ``strategy.stats``.

    ``peak_device_bytes`` is ``torch.cuda.max_memory_allocated`` on CUDA and the engine's
    ledger (model state plus saved activations) on CPU; ``peak_reserved_bytes`` is the
    caching allocator's reserve on CUDA and equals the ledger on CPU. ``step_seconds`` is
    the measured forward plus backward time (CUDA events on GPU, wall clock on CPU); the
    ``predicted_*`` figures are the plan's for this step (``None`` in a profiling step)
    and the ``*_error`` figures are measured over predicted, less one.

    Example:
        >>> stats = trainer.strategy.stats  # doctest: +SKIP
        >>> stats.bytes_swapped_out, stats.wait_seconds  # doctest: +SKIP
    """

    bytes_swapped_out: int
    bytes_swapped_in: int
    wait_seconds: float
    peak_device_bytes: int
    peak_reserved_bytes: int
    ledger_peak_bytes: int
    swapped_layers: int
    profiling: bool
    step_seconds: float
    predicted_peak_bytes: int | None = None
    predicted_step_seconds: float | None = None

    @property
    def peak_error(self) -> float | None:
        if not self.predicted_peak_bytes:
            return None
        return self.peak_device_bytes / self.predicted_peak_bytes - 1.0

    @property
    def step_time_error(self) -> float | None:
        if not self.predicted_step_seconds:
            return None
        return self.step_seconds / self.predicted_step_seconds - 1.0

    def as_metrics(self) -> dict[str, float]:
        names = (
            "bytes_swapped_out",
            "bytes_swapped_in",
            "wait_seconds",
            "peak_device_bytes",
            "peak_reserved_bytes",
            "step_seconds",
            "peak_error",
            "step_time_error",
        )
        values = {name: getattr(self, name) for name in names}
        return {f"accudnn/{name}": float(value) for name, value in values.items() if value is not None}


class OffloadController:
    """Turns a budget into swap schedules for the engine, step after step.

    The first step (and the first with a batch shape not seen before) runs in the safe mode,
    swapping every swappable activation with the smallest prefetch window; what it
    measured (bytes and time per layer, with the measured host link) becomes a
    :class:`~lightning_accudnn.planner.StepProfile` and the planner chooses the plan the
    following steps run. The first planned step re-plans once from its own timings, which
    the safe mode's copies no longer distort. Later, a step whose layers or sizes differ
    from the profile re-plans from its own measurements, and a step whose peak passed the
    usable budget grows the reserve by the overshoot and re-plans.

    Example:
        >>> controller = OffloadController(budget="2GB", min_swap_bytes=0)
        >>> controller.setup(torch.device("cpu"))  # doctest: +SKIP
    """

    def __init__(
        self,
        budget: int | str = "auto",
        *,
        min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES,
        keep_on_device: Sequence[str] = (),
        host_memory_limit: int | str | None = None,
        reserve_bytes: int | None = None,
        coordinator: RankCoordinator | None = None,
    ) -> None:
        self.budget = Budget.parse(budget)
        self.coordinator = coordinator if coordinator is not None else RankCoordinator()
        self.host_memory_limit = None if host_memory_limit is None else Budget.parse(host_memory_limit)
        if min_swap_bytes < 0:
            raise ValueError(f"min_swap_bytes must be >= 0, got {min_swap_bytes}")
        if reserve_bytes is not None and reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        self.min_swap_bytes = min_swap_bytes
        self.keep_on_device = tuple(keep_on_device)
        self.reserve_bytes_arg = reserve_bytes
        self.budget_bytes: int | None = None
        self.reserve_bytes = 0
        self.device: torch.device | None = None
        self.engine: OffloadEngine | None = None
        self.plan: Plan | None = None
        self.stats: OffloadStats | None = None
        self._batch_signature: object = None
        self._plans_by_batch: dict[object, Plan] = {}
        self._profiling = False
        self._refined = False
        self._step_plan: Plan | None = None
        self._memory_fraction_set = False

    # -- lifecycle ---------------------------------------------------------------------

    def setup(self, device: torch.device) -> None:
        """Resolve the budget for ``device``, cap the allocator on CUDA, build the engine."""
        self.device = device
        total, free, name = _device_memory(device)
        self.budget_bytes = self.budget.resolve(total, free, device_name=name)
        if self.reserve_bytes_arg is not None:
            self.reserve_bytes = self.reserve_bytes_arg
        elif device.type == "cuda":
            self.reserve_bytes = max(256 * 2**20, self.budget_bytes // 20)
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(self.budget_bytes / total, device)
            self._memory_fraction_set = True
        else:
            warnings.warn(
                "lightning-accudnn on CPU: activations are copied through the host-copy backend and the "
                "budget is checked against the engine's ledger, but no memory is saved. Use a CUDA device "
                "to train beyond its memory.",
                stacklevel=2,
            )
        host_total = psutil.virtual_memory().total
        host_limit = (
            int(host_total * DEFAULT_HOST_MEMORY_SHARE)
            if self.host_memory_limit is None
            else self.host_memory_limit.resolve(host_total, device_name="host memory")
        )
        if self.engine is not None:
            self.engine.close()
        self.engine = OffloadEngine(
            device,
            min_swap_bytes=self.min_swap_bytes,
            exclude=self.keep_on_device,
            host_memory_limit=host_limit,
        )
        spec = "" if self.budget.kind == "bytes" else f" ({self.budget})"
        rank_zero_info(
            f"accudnn: budget {format_bytes(self.budget_bytes)}{spec} on {name}, reserve "
            f"{format_bytes(self.reserve_bytes)}, host memory for swapped activations up to "
            f"{format_bytes(host_limit)}; the first step profiles with every activation swapped"
        )

    def teardown(self) -> None:
        """Abort any open step, free the host pool, lift the allocator cap."""
        if self.engine is not None:
            self.engine.close()
        if self._memory_fraction_set and self.device is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
            self._memory_fraction_set = False

    def abort(self) -> None:
        """A step failed: drop its swapped activations and return their buffers."""
        if self.engine is not None:
            self.engine.abort_step()

    # -- one step ----------------------------------------------------------------------

    @contextmanager
    def forward(
        self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], batch: Any
    ) -> Iterator[None]:
        """Hook the training step's forward pass with this step's schedule."""
        engine = self._require_engine()
        if engine.step_open:  # a previous training_step returned without a backward
            engine.abort_step()
        static_bytes = model_state_bytes(model, optimizers)
        signature = _batch_signature(batch)
        if signature != self._batch_signature:
            # A batch shape seen before (the short last batch of an epoch) keeps its plan.
            self._batch_signature = signature
            self.plan = self._plans_by_batch.get(signature)
        if self.plan is None:
            self._profiling, self._refined = True, False
            self._step_plan = None
            schedule = SwapSchedule.swap_everything(
                max_copying_out_bytes=copying_out_limit(self._require_budget())
            )
        else:
            self._profiling = False
            if static_bytes != self.plan.profile.static_bytes:
                self.plan = self._make_plan(dataclasses.replace(self.plan.profile, static_bytes=static_bytes))
            self._step_plan = self.plan
            kept = {layer.name for layer in self.plan.profile.layers} - self.plan.swapped_layers
            schedule = SwapSchedule.keep_layers_named(
                kept, self.plan.prefetch_window_bytes, self.plan.max_copying_out_bytes
            )
        with engine.offload(model, schedule, static_bytes=static_bytes):
            yield

    def begin_backward(self) -> None:
        self._require_engine().begin_backward()

    def end_step(self) -> OffloadStats | None:
        """After backward: keep the step's figures and plan from them when needed.

        Every rank reaches this after every backward, so the decision to re-plan and the
        profile planned from are agreed through the coordinator: all ranks plan alike.
        """
        engine = self._require_engine()
        step = engine.end_step()
        if step is None:
            return None
        self.stats = self._measure(step)
        profile = self._profile_from(step)
        usable = self._require_budget() - self.reserve_bytes
        overshoot = 0 if self._profiling else max(0, self.stats.peak_device_bytes - usable)
        first_planned = not self._profiling and not self._refined
        changed = self.plan is None or _layers_changed(self.plan.profile, profile)
        local_reason = overshoot > 0 or self._profiling or first_planned or changed
        if not self.coordinator.any(local_reason):
            return self.stats
        overshoot = int(self.coordinator.max(overshoot))
        if overshoot:
            self.reserve_bytes += overshoot
            log.warning(
                "accudnn: step peak passed the usable budget %s by %s; reserve raised to %s and re-planned",
                format_bytes(usable),
                format_bytes(overshoot),
                format_bytes(self.reserve_bytes),
            )
        self._refined = self._refined or first_planned
        self.plan = self._make_plan(self.coordinator.merge(profile))
        return self.stats

    # -- helpers -----------------------------------------------------------------------

    def _make_plan(self, profile: StepProfile) -> Plan:
        budget = self._require_budget()
        plan = plan_swaps(
            profile, budget, self.reserve_bytes, max_copying_out_bytes=copying_out_limit(budget)
        )
        host_limit = self._require_engine().pool.capacity_bytes
        if plan.swapped_bytes > host_limit:
            raise HostMemoryExceeded(
                f"the plan for a device budget of {format_bytes(budget)} swaps "
                f"{format_bytes(plan.swapped_bytes)} to host memory, more than the host-memory limit of "
                f"{format_bytes(host_limit)}. Raise host_memory_limit (system RAM permitting), raise the "
                "device budget, or lower the batch size."
            )
        rank_zero_info(
            f"accudnn plan: swap {len(plan.swapped_layers)} of {len(profile.layers)} layers "
            f"({format_bytes(plan.swapped_bytes)} of {format_bytes(profile.saved_bytes)} saved), "
            f"predicted peak {format_bytes(plan.predicted_peak_bytes)} of budget {format_bytes(budget)}, "
            f"step {plan.predicted_step_seconds * 1e3:.1f} ms, bound ratio {plan.bound_ratio:.2f}"
        )
        self._plans_by_batch[self._batch_signature] = plan
        return plan

    def _profile_from(self, step: StepStats) -> StepProfile:
        assert self.device is not None
        link = host_link(self.device)
        return StepProfile(
            layers=step.layers,
            static_bytes=self._require_engine().ledger.static_bytes,
            d2h_bytes_per_second=link.d2h_bytes_per_second,
            h2d_bytes_per_second=link.h2d_bytes_per_second,
        )

    def _require_budget(self) -> int:
        if self.budget_bytes is None:
            raise RuntimeError("the offload controller is not set up: call setup(device) first")
        return self.budget_bytes

    def _measure(self, step: StepStats) -> OffloadStats:
        peak, reserved = step.ledger_peak_bytes, step.ledger_peak_bytes
        if self.device is not None and self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return OffloadStats(
            bytes_swapped_out=step.bytes_swapped_out,
            bytes_swapped_in=step.bytes_swapped_in,
            wait_seconds=step.wait_seconds,
            peak_device_bytes=peak,
            peak_reserved_bytes=reserved,
            ledger_peak_bytes=step.ledger_peak_bytes,
            swapped_layers=step.swapped_layers,
            profiling=self._profiling,
            step_seconds=step.forward_seconds + step.backward_seconds,
            predicted_peak_bytes=None if self._step_plan is None else self._step_plan.predicted_peak_bytes,
            predicted_step_seconds=None
            if self._step_plan is None
            else self._step_plan.predicted_step_seconds,
        )

    def _require_engine(self) -> OffloadEngine:
        if self.engine is None:
            raise RuntimeError("the offload controller is not set up: call setup(device) first")
        return self.engine


def _device_memory(device: torch.device) -> tuple[int, int, str]:
    """Total bytes, free bytes and a name for ``device``."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free, torch.cuda.get_device_name(device)
    memory = psutil.virtual_memory()
    return memory.total, memory.available, "host memory (CPU device)"


def _batch_signature(batch: Any) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    leaves, _ = tree_flatten(batch)
    return tuple((tuple(leaf.shape), leaf.dtype) for leaf in leaves if isinstance(leaf, torch.Tensor))


def _layers_changed(old: StepProfile, new: StepProfile) -> bool:
    return [(layer.name, layer.saved_bytes) for layer in old.layers] != [
        (layer.name, layer.saved_bytes) for layer in new.layers
    ]
