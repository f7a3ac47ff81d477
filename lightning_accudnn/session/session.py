"""The adaptive offload loop, without Lightning: profile, plan, run, measure, re-plan.

One :class:`OffloadSession` serves one device. The Lightning strategies hold one each; a
plain PyTorch loop or a Lightning Fabric loop makes its own.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lightning_accudnn.ops import OffloadEngine, Runtime
from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.ops.recompute import SegmentRecomputer
from lightning_accudnn.planner import Plan, format_bytes
from lightning_accudnn.planner.headroom import Headroom
from lightning_accudnn.planner.plan import ROUTE_WHOLE_MODEL
from lightning_accudnn.profiling.bandwidth import probe_host_link
from lightning_accudnn.session.agreement import PlanAgreement
from lightning_accudnn.session.allocator import AllocatorControl, allocator_control_for
from lightning_accudnn.session.backward_end import BackwardEnd
from lightning_accudnn.session.buffer_snapshot import BufferSnapshot
from lightning_accudnn.session.collector_pause import CollectorPause
from lightning_accudnn.session.compiled import (
    CompiledModelError,
    refusal_message,
    refuse_whole_model_compile,
    route_of,
    whole_model_form,
)
from lightning_accudnn.session.config import OffloadConfig
from lightning_accudnn.session.coordination import RankCoordinator
from lightning_accudnn.session.device import require_available, resolve_headroom, with_index
from lightning_accudnn.session.gradient_buckets import gradient_bucket_bytes
from lightning_accudnn.session.host_memory import host_memory_limit
from lightning_accudnn.session.out_of_memory import (
    MAX_OUT_OF_MEMORY_RETRIES,
    is_out_of_memory,
    release_failed_pass,
)
from lightning_accudnn.session.pass_records import SMALLEST_COPY_OUT_LIMIT, PassRecords
from lightning_accudnn.session.passes import PassRunner
from lightning_accudnn.session.patterns import check_keep_on_device
from lightning_accudnn.session.plan_book import PassKey, batch_signature
from lightning_accudnn.session.planning import SessionPlanning
from lightning_accudnn.session.stats import OffloadStats

if TYPE_CHECKING:  # imported where a model compiled whole needs it: it imports Inductor (about 1 s)
    from lightning_accudnn.whole_model_compile.route import WholeModelRoute

__all__ = ["MAX_OUT_OF_MEMORY_RETRIES", "SMALLEST_COPY_OUT_LIMIT", "OffloadSession", "is_out_of_memory"]

log = logging.getLogger("lightning_accudnn")


@dataclass
class _Block:
    """One ``session.step(...)`` block: its model, optimizers and the engine context it holds."""

    model: nn.Module
    optimizers: tuple[torch.optim.Optimizer, ...]
    signature: Any
    thread: int
    position: int = 0
    engine_context: AbstractContextManager[None] | None = None
    pass_closed: bool = False  # a pass ended while the block was open (manual optimization)
    hooks: list[RemovableHandle] = field(default_factory=list)


class OffloadSession:
    """Swap saved activations so that each training pass fits ``config.budget`` on ``device``.

    The first pass of each kind runs in the safe mode (every swappable activation swapped);
    what it measured (bytes and time per layer, the host link) is planned from, and the
    following passes run the plan. The first planned pass re-plans once from its own
    timings; a pass whose layers changed re-plans from its own measurements; a pass whose
    peak passed the usable budget grows the reserve by the overshoot and re-plans. A pass is
    told apart by the model, the batch's shapes and its position in the step, so a short
    last batch or a GAN's second optimizer keeps its own plan; a batch shape not seen before
    runs a plan scaled from, or made for, another shape of the same pass
    (:mod:`~lightning_accudnn.session.shapes`), not a profiling step. A budget too small for any
    plan raises :class:`~lightning_accudnn.planner.BudgetTooSmallError` at the end of the
    first backward, before any optimizer step, naming the smallest budget that works: never
    below the profiling pass's own peak (it runs first in every run and never recomputes), so
    under policy ``"auto"`` or ``"recompute"`` a budget only recomputation would fit is refused.
    A model compiled whole is refused unless ``config.whole_model_compile`` puts it on the
    experimental route of :mod:`~lightning_accudnn.whole_model_compile` (planned inside its
    compiled graph at the end of its first forward).

    A plain loop (the step closes itself when backward ends)::

        session = OffloadSession(OffloadConfig(budget="12GB"), device=torch.device("cuda"))
        for x, y in loader:
            with session.step(model, optimizer):   # the forward runs under the plan
                loss = loss_fn(model(x), y)
            loss.backward()                         # swapped activations come back as needed
            optimizer.step(); optimizer.zero_grad()
        print(session.plan); session.stats.bytes_swapped_out
        session.close()

    Args:
        config: the offload options.
        device: the training device (``"cuda"``, ``torch.device("cuda", 1)``, ``"cpu"``).
        runtime: handed to the engine (``OffloadEngine(..., runtime=runtime)``), e.g. a
            simulated GPU in tests; ``None`` for the real device.
        coordinator: how ranks agree on planning (see
            :class:`~lightning_accudnn.session.DistributedCoordinator`); one process by default.
        report: where one-line reports go (budget, each new plan); default the
            ``lightning_accudnn`` logger at INFO.
        on_stats: called with every pass's :class:`OffloadStats` (a strategy logs them).
        allocator: how the device's allocator is capped and its peaks read (see
            :class:`~lightning_accudnn.session.allocator.AllocatorControl`); by default CUDA's
            caching allocator, none on CPU. Tests pass a fake.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> session = OffloadSession(OffloadConfig(budget=1_000_000, min_swap_bytes=0), "cpu")
        >>> for _ in range(3):
        ...     with session.step(model, optimizer):
        ...         loss = model(torch.randn(32, 64)).square().mean()
        ...     loss.backward()
        ...     optimizer.step(); optimizer.zero_grad()
        >>> session.stats.profiling, session.plan is not None
        (False, True)
        >>> session.close()
    """

    def __init__(
        self,
        config: OffloadConfig,
        device: torch.device | str | int,
        *,
        runtime: Runtime | None = None,
        coordinator: RankCoordinator | None = None,
        report: Callable[[str], None] | None = None,
        on_stats: Callable[[OffloadStats], None] | None = None,
        allocator: AllocatorControl | None = None,
    ) -> None:
        self.config = config
        requested = torch.device(device)
        require_available(requested)
        self.device = with_index(requested)
        self.plans_alone = False
        """True inside :meth:`planning_alone`: steps run on this rank alone, and what runs them
        (the batch-size search) settles their errors with the other ranks itself."""
        self.report = report if report is not None else log.info
        self._block: _Block | None = None
        self._backward_end = BackwardEnd(self._close_pass_from_backward)
        self._checked_models: set[int] = set()
        self._whole_models: dict[int, WholeModelRoute] = {}  # models compiled whole, on that route
        self._closed = False
        self.allocator: AllocatorControl = (
            allocator if allocator is not None else allocator_control_for(self.device)
        )
        headroom, name = resolve_headroom(config, self.device)
        if self.device.type != "cuda":
            warnings.warn(
                "lightning-accudnn on CPU: activations are copied through the host-copy backend and the "
                "budget is checked against the engine's ledger, but no memory is saved. Use a CUDA device "
                "to train beyond its memory.",
                stacklevel=2,
            )
        host_limit = host_memory_limit(config.parsed_host_memory_limit)
        self.engine = OffloadEngine(
            self.device,
            min_swap_bytes=config.min_swap_bytes,
            exclude=config.keep_on_device,
            host_memory_limit=host_limit,
            runtime=runtime,
        )
        self._passes = PassRunner(
            self.engine,
            PassRecords(
                self.device, min_swap_bytes=config.min_swap_bytes, observe_every=config.observe_every
            ),
            SessionPlanning(
                headroom,
                self.engine,
                policy=config.policy,
                min_swap_bytes=config.min_swap_bytes,
                report=self.report,
                reserve_rule=self.device.type if config.reserve_bytes is None else None,
            ),
            PlanAgreement(coordinator if coordinator is not None else RankCoordinator()),
            self.allocator,
            CollectorPause(config.pause_gc),  # off from a pass's forward to its end
            probe_host_link,
            selective_probe=config.policy in ("auto", "selective"),
            plan_in_background=config.plan_in_background,
            on_stats=on_stats,
        )
        self.recomputer: SegmentRecomputer = self._passes.recomputer  # the plan's recomputed segments
        # The link probe allocates device memory: before the allocator is capped (each step caps it).
        probe_host_link(self.device)
        spec = "" if config.parsed_budget.kind == "bytes" else f" ({config.budget})"
        self.report(
            f"accudnn: budget {format_bytes(headroom.budget_bytes)}{spec} on {name}, reserve "
            f"{format_bytes(headroom.reserve_bytes)}, host memory for swapped activations up to "
            f"{format_bytes(host_limit)}; the first pass profiles with every activation swapped"
        )

    @property
    def headroom(self) -> Headroom:
        """The budget the allocator is capped at and the reserve kept free under it (the reserve
        grows when a pass goes past its room); every plan is made under its usable bytes."""
        return self._passes.planning.headroom

    @property
    def budget_bytes(self) -> int:
        """The budget, in bytes (``config.budget`` resolved on the device)."""
        return self.headroom.budget_bytes

    @property
    def reserve_bytes(self) -> int:
        """The reserve kept free under the budget, in bytes (it grows when a pass goes past its room)."""
        return self.headroom.reserve_bytes

    def smallest_budget_bytes(self, usable_bytes: int) -> int:
        """The smallest budget under which a plan may use ``usable_bytes``: with the default
        reserve, which grows with the budget, less that reserve and any raised on top of it;
        with ``OffloadConfig.reserve_bytes`` given, less the reserve now. The budget a refusal
        names is made so.

        Example:
            >>> session = OffloadSession(OffloadConfig(budget=10**6, reserve_bytes=1_000), "cpu")
            >>> session.smallest_budget_bytes(5_000)
            6000
            >>> session.close()
        """
        return self._passes.planning.budget_for()(usable_bytes)

    @property
    def plan(self) -> Plan | None:
        """The plan of the last pass entered or planned (``None`` until the first plan)."""
        return self._passes.plan

    @property
    def stats(self) -> OffloadStats | None:
        """The last closed pass's figures (``None`` before the first)."""
        return self._passes.stats

    @property
    def gradient_bucket_bytes(self) -> int:
        """DDP's gradient buckets, counted as model state (:meth:`count_gradient_buckets`)."""
        return self._passes.gradient_bucket_bytes

    @property
    def coordinator(self) -> RankCoordinator:
        """How ranks agree on planning (see :class:`~lightning_accudnn.session.DistributedCoordinator`)."""
        return self._passes.agreement.coordinator

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Abort any open pass, free the host pool, lift the allocator cap. Idempotent.

        Every release runs even when an earlier one raises (the first error is raised after
        them all): a failure freeing the pool must not leave the allocator capped.
        """
        self._closed = True
        with ExitStack() as releases:  # runs its callbacks last-registered first
            for release in (
                self.allocator.lift,
                self.recomputer.remove,
                self._passes.segment_probe.detach,
                self._passes.collector.resume,
                self.engine.close,
                self._backward_end.remove,
                self._passes.background_plans.close,
            ):
                releases.callback(release)

    def pause_training(self) -> None:
        """Training pauses (validation, testing, prediction run next): lift the allocator cap.

        The memory fraction in force before the session capped it is back, so evaluation
        with larger batches is not held to the training budget; the next training step caps
        the allocator again.
        """
        self.allocator.lift()
        self._passes.collector.resume()

    def count_gradient_buckets(self, wrapper: nn.Module) -> None:
        """Count ``wrapper``'s gradient buckets (a ``DistributedDataParallel``) as model state.

        See :func:`~lightning_accudnn.session.gradient_buckets.gradient_bucket_bytes` for
        what is counted; the figure is added to every pass's static memory from now on.
        """
        self._passes.gradient_bucket_bytes = gradient_bucket_bytes(wrapper)

    def snapshot_buffers(self, model: nn.Module) -> BufferSnapshot:
        """A :class:`~lightning_accudnn.session.buffer_snapshot.BufferSnapshot` of ``model``, for
        a caller that retries steps after :meth:`recover_from_out_of_memory`: take it before each
        step, restore it before running a step again. Its copy of the buffers stays on their
        device all training, so its bytes there are counted as model state in every pass from
        now on (the last snapshot's, when several are made).

        Example:
            >>> session = OffloadSession(OffloadConfig(budget="1GB"), "cpu")
            >>> snapshot = session.snapshot_buffers(nn.BatchNorm1d(4))
            >>> session.buffer_snapshot_bytes  # two running statistics of 4 floats, a counter
            40
            >>> session.close()
        """
        snapshot = BufferSnapshot(model)
        self._passes.buffer_snapshot_bytes = snapshot.bytes_on(self.device)
        return snapshot

    @property
    def buffer_snapshot_bytes(self) -> int:
        """Device bytes of the buffer copy counted as model state (:meth:`snapshot_buffers`)."""
        return self._passes.buffer_snapshot_bytes

    def recover_from_out_of_memory(self, error: BaseException | None = None) -> bool:
        """A pass ran out of device memory (``error``): abort it and re-plan with a larger reserve.

        Returns ``True`` when the caller may retry the step: the pass that failed ran under
        a plan, it has not failed :data:`MAX_OUT_OF_MEMORY_RETRIES` times in a row, and the
        reserve (grown by an eighth of the budget) still leaves a plan; every known plan is
        re-made with it (logged as a warning). Returns ``False`` when retrying cannot help:
        the caller re-raises. A planned pass that failed with ``error`` once more than that
        raises :class:`~lightning_accudnn.session.out_of_memory.OutOfMemoryAfterRetriesError`
        from it. A profiling pass already runs in the least memory, so when it
        failed with ``error`` this raises
        :class:`~lightning_accudnn.session.out_of_memory.ProfilingPassOutOfMemoryError` from
        it (the budget is too small, and its message says what to do). A budget left too small
        by the larger reserve raises :class:`~lightning_accudnn.planner.BudgetTooSmallError`.
        """
        self.abort()
        return self._passes.retry_out_of_memory(error)

    def release_failed_pass(self) -> None:
        """Free what a failed pass left unreachable, before its step runs again
        (:func:`~lightning_accudnn.session.out_of_memory.release_failed_pass`)."""
        release_failed_pass(self.device)

    def __enter__(self) -> OffloadSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def abort(self, error: BaseException | None = None) -> RecomputationError | None:
        """A pass failed: drop its swapped activations and return their buffers.

        When the pass failed recomputing a segment (``error``, or a failure the recomputer
        recorded, as when a plain loop's backward raised and the next step aborts the pass),
        the segment is kept out of every later plan of the model, the plans that recompute it
        are re-made (a warning names it and why) and the failure is returned as a
        :class:`~lightning_accudnn.ops.errors.RecomputationError`: the step computed no
        trustworthy gradient, and running it again under the new plan is exact.
        """
        self._backward_end.remove()
        return self._passes.abort(error)

    def check_model(self, model: nn.Module, compiled_form: str | None = None) -> None:
        """Refuse what cannot train under the session, before training: lazy modules not run yet
        (their state's bytes are unknown), ``keep_on_device`` patterns matching no module, and a
        model compiled whole (regional compilation is fine)
        unless ``config.whole_model_compile`` puts it on the experimental route
        (:mod:`~lightning_accudnn.whole_model_compile`). ``compiled_form`` says how ``model``
        was compiled whole when the model itself does not show it (Lightning compiled it)."""
        if id(model) in self._checked_models:
            return
        lazy = [name for name, parameter in model.named_parameters() if is_lazy(parameter)]
        if lazy:
            raise ValueError(
                f"{type(model).__name__} has parameters whose shapes are not known yet (lazy modules: "
                f"{', '.join(lazy[:3])}{', ...' if len(lazy) > 3 else ''}); the plan counts the model's "
                "state from them. Run one forward pass on a batch first (under torch.no_grad(); in a "
                "LightningModule, in its setup() hook), or give the layers their sizes."
            )
        form = compiled_form if compiled_form is not None else whole_model_form(model)
        if form is not None and self.config.whole_model_compile is None:
            raise CompiledModelError(refusal_message(form))
        if form is None:
            refuse_whole_model_compile(model, self.config.keep_on_device)
            check_keep_on_device(self.config.keep_on_device, model)  # on the route: once its graph is seen
            self._passes.routes[id(model)] = route_of(model)
        else:
            from lightning_accudnn.whole_model_compile.route import WholeModelRoute

            self._whole_models[id(model)] = WholeModelRoute.started(
                form,
                self.config.whole_model_backend,
                accelerator=self.device.type != "cpu",
                report=self.report,
            )
            self._passes.routes[id(model)] = ROUTE_WHOLE_MODEL
        self._checked_models.add(id(model))

    def whole_model_route(self, model: nn.Module) -> WholeModelRoute | None:
        """How ``model``, compiled whole, is compiled in training passes; ``None`` on other routes."""
        return self._whole_models.get(id(model))

    def wait_for_plans(self) -> None:
        """Wait for the plans being made on planning threads
        (``OffloadConfig.plan_in_background``) and adopt them: ``plan`` is then the newest, and
        the next pass of each kind runs its own. For a benchmark's warm-up, a tuner reading the
        plan, or a test that asserts which plan a pass runs.

        Example:
            >>> session = OffloadSession(OffloadConfig(budget="1GB"), "cpu")
            >>> session.wait_for_plans()  # none in the making
            >>> session.close()
        """
        self._passes.wait_for_plans()

    @contextmanager
    def planning_alone(self) -> Iterator[None]:
        """Within the block this process plans from its own profile, with no collectives
        (the batch-size search runs each rank on its own)."""
        alone, self.plans_alone = self.plans_alone, True
        try:
            with self._passes.agreement.alone():
                yield
        finally:
            self.plans_alone = alone

    # -- one step ----------------------------------------------------------------------

    @contextmanager
    def step(
        self,
        model: nn.Module,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] = (),
        *,
        batch: Any = None,
        close_on_backward: bool = True,
    ) -> Iterator[None]:
        """Run the forward passes inside under this session's plan.

        ``optimizers`` count towards the static memory (their state, also before it exists).
        ``batch`` tells the passes of different batch shapes apart; without it the shapes of
        the model's first call in the block are used (so ``model`` must be called in the
        block). With ``close_on_backward`` the pass closes itself when a backward through
        the model's output ends (measure, plan); a driver that runs backward itself (a
        strategy) passes ``False`` and calls :meth:`begin_backward` and
        :meth:`end_backward` around it. Several passes may run inside one block (manual
        optimization: forward, backward, optimizer step, forward, ...), each with its own
        plan, as long as backward runs inside the block for all but the last.
        """
        if self._closed:
            raise RuntimeError("this OffloadSession is closed; make a new one")
        if self._block is not None:
            raise RuntimeError("session.step blocks do not nest: one is already open")
        if self.engine.step_open:  # the previous pass never ran its backward
            self.abort()
        self._backward_end.remove()
        self.check_model(model)
        self.allocator.cap(self.headroom.budget_bytes)
        if isinstance(optimizers, torch.optim.Optimizer):
            optimizers = (optimizers,)
        block = _Block(
            model=model,
            optimizers=tuple(optimizers),
            signature=None if batch is None else batch_signature(batch),
            thread=threading.get_ident(),
        )
        self._block = block
        whole_model = id(model) in self._whole_models  # no hooks on it: they would run in compiled code
        try:
            if batch is None and not whole_model:
                block.hooks.append(model.register_forward_pre_hook(self._on_model_call, with_kwargs=True))
            else:
                self._enter_pass()
            if close_on_backward and not whole_model:
                block.hooks.append(model.register_forward_hook(self._on_model_output))
            yield
        except BaseException as error:
            self._leave_pass(error)
            raise
        else:
            if block.engine_context is None and not block.pass_closed:
                raise RuntimeError(
                    f"nothing ran under session.step: the model ({type(model).__name__}) was not called "
                    "inside the block. Call it there, or pass batch=... when the forward calls only its "
                    "submodules."
                )
            self._leave_pass(None)
        finally:
            for handle in block.hooks:
                handle.remove()
            self._block = None

    def begin_backward(self) -> None:
        """The forward pass is over and backward starts (for drivers that run backward)."""
        self.engine.begin_backward()

    def end_backward(self) -> OffloadStats | None:
        """After backward: measure the pass, plan when needed, and ready the next pass of the step.

        Returns the pass's figures, or ``None`` when no pass was open (it closed itself).
        Raises :class:`~lightning_accudnn.planner.BudgetTooSmallError` when no plan fits.
        """
        stats = self._close_pass()
        block = self._block
        if block is not None and block.engine_context is not None and block.thread == threading.get_ident():
            # Manual optimization: the next forward in this block is the next pass of the step.
            self._leave_pass(None)
            self._enter_pass()
        return stats

    # -- passes ------------------------------------------------------------------------

    def _on_model_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        block = self._block
        if block is None:
            return
        if block.engine_context is None:
            block.signature = batch_signature((args, kwargs))
            self._enter_pass()
        elif block.pass_closed and not self.engine.step_open:
            # The previous pass closed from inside backward; this call starts the next one.
            self._leave_pass(None)
            self._enter_pass()

    def _on_model_output(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self._backward_end.watch(output)

    def _enter_pass(self) -> None:
        block = self._block
        assert block is not None
        whole_model = self._whole_models.get(id(block.model))
        if whole_model is not None:
            # Nothing for the engine to do: the compiled graph moves its activations itself (and
            # makes no Python objects per activation, so the collector stays on).
            context = whole_model.compiled()
            context.__enter__()
            block.engine_context = context
            block.pass_closed = False
            return
        key = PassKey(model=id(block.model), batch=block.signature, position=block.position)
        block.engine_context = self._passes.enter(block.model, block.optimizers, key)
        block.pass_closed = False

    def _leave_pass(self, error: BaseException | None) -> None:
        block = self._block
        if block is None or block.engine_context is None:
            return
        context, block.engine_context = block.engine_context, None
        self._passes.leave(context, error)
        whole_model = self._whole_models.get(id(block.model))
        if whole_model is not None and error is None and not whole_model.planned:
            self._plan_whole_model(block, whole_model)

    def _plan_whole_model(self, block: _Block, whole_model: WholeModelRoute) -> None:
        """After the trial forward of a model compiled whole: plan from what its graph saves."""
        key = PassKey(model=id(block.model), batch=(), position=0)  # one plan for every batch shape
        self._passes.plan = whole_model.plan_from_trial(
            self._passes.model_state_bytes(block.model, block.optimizers, refresh=True),
            self.config.min_swap_bytes,
            self.config.keep_on_device,
            lambda profile: self._passes.make_plan(profile, key),
        )

    def _close_pass_from_backward(self) -> None:
        self._backward_end.remove()
        self._close_pass()

    def _close_pass(self) -> OffloadStats | None:
        """Measure the pass that just ran backward, and plan when the ranks agree to
        (:meth:`PassRunner.conclude`); ``None`` when no pass was open."""
        ended = self._passes.end()
        if ended is None:
            return None
        block = self._block
        if block is not None:
            block.position += 1
            block.pass_closed = True
        return self._passes.conclude(*ended)


def is_lazy(parameter: torch.Tensor) -> bool:
    """Whether ``parameter`` belongs to a lazy module not run yet (its shape is not known).

    Example:
        >>> is_lazy(nn.LazyLinear(4).weight), is_lazy(nn.Linear(2, 4).weight)
        (True, False)
    """
    return isinstance(parameter, nn.parameter.UninitializedParameter)
