"""The adaptive offload loop, without Lightning: profile, plan, run, measure, re-plan.

One :class:`OffloadSession` serves one device. The Lightning strategies hold one each; a
plain PyTorch loop or a Lightning Fabric loop makes its own.
"""

from __future__ import annotations

import gc
import logging
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import psutil
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from lightning_accudnn.ops import HostMemoryExceeded, OffloadEngine, Runtime, StepStats, SwapSchedule
from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.ops.layers import SaveSequence
from lightning_accudnn.ops.recompute import SegmentProbe, SegmentRecomputer
from lightning_accudnn.planner import BudgetTooSmallError, Plan, StepProfile, format_bytes
from lightning_accudnn.planner.plan import ROUTE_EAGER, ROUTE_WHOLE_MODEL, HostLimitTooSmallError, plan_swaps
from lightning_accudnn.profile import LayerProfile
from lightning_accudnn.profiling.bandwidth import HostLink, probe_host_link
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session.allocator import AllocatorControl, allocator_control_for
from lightning_accudnn.session.backward_end import BackwardEnd
from lightning_accudnn.session.collector_pause import CollectorPause
from lightning_accudnn.session.compiled import (
    CompiledModelError,
    refusal_message,
    refuse_whole_model_compile,
    route_of,
    whole_model_form,
)
from lightning_accudnn.session.config import DEFAULT_HOST_MEMORY_SHARE, OffloadConfig, default_reserve_bytes
from lightning_accudnn.session.coordination import RankCoordinator, ReplanRequest
from lightning_accudnn.session.device import device_memory, require_available, with_index
from lightning_accudnn.session.gradient_buckets import gradient_bucket_bytes
from lightning_accudnn.session.host_memory import default_host_memory_limit
from lightning_accudnn.session.patterns import check_keep_on_device
from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource, batch_signature
from lightning_accudnn.session.recompute_failures import RecomputeFailures
from lightning_accudnn.session.recompute_pass import profile_to_plan_from, recomputable_segments
from lightning_accudnn.session.shapes import ShapePlanner, same_pass_other_shape
from lightning_accudnn.session.stats import OffloadStats
from lightning_accudnn.session.steady_memo import SteadyMemo
from lightning_accudnn.session.transfers import layer_host_bytes, swapped_buffer_sizes, transfer_sizes

if TYPE_CHECKING:  # imported where a model compiled whole needs it: it imports Inductor (about 1 s)
    from lightning_accudnn.session.whole_model import WholeModelRoute

__all__ = ["MAX_OUT_OF_MEMORY_RETRIES", "SMALLEST_COPY_OUT_LIMIT", "OffloadSession", "is_out_of_memory"]

log = logging.getLogger("lightning_accudnn")

#: The copy-out limit of the safest mode, which the profiling pass runs under: one storage in
#: flight at a time (the least memory any plan holds, as the planner's smallest budget assumes).
SMALLEST_COPY_OUT_LIMIT = 0

#: How many times in a row a planned pass that ran out of device memory is re-planned with a
#: larger reserve and retried before the error ends the run.
MAX_OUT_OF_MEMORY_RETRIES = 3


def is_out_of_memory(error: BaseException) -> bool:
    """True for a device out-of-memory error (``torch.OutOfMemoryError``, CUDA's included).

    Example:
        >>> is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")), is_out_of_memory(ValueError())
        (True, False)
    """
    return isinstance(error, torch.OutOfMemoryError)


@dataclass
class _Pass:
    """The forward/backward pass in progress: which one it is and what it runs under."""

    key: PassKey
    plan: Plan | None  # None: a profiling pass
    source: PlanSource  # how the plan was made


@dataclass(frozen=True)
class _Measured:
    """A pass kind's latest measurement: its profile, the plan whose times an untimed pass
    borrows, and whether it ran under a plan (a plan made from it is then refined)."""

    profile: StepProfile
    times_of: Plan | None
    planned: bool

    def profile_to_plan(self) -> StepProfile:
        if self.times_of is None:
            return self.profile
        layers = _with_times_of(self.profile.layers, self.times_of.profile.layers)
        return replace(self.profile, layers=layers)


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
    experimental route of :mod:`~lightning_accudnn.session.whole_model` (planned inside its
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
        self.coordinator = coordinator if coordinator is not None else RankCoordinator()
        self.plans_alone = False
        """True inside :meth:`planning_alone`: steps run on this rank alone, and what runs them
        (the batch-size search) settles their errors with the other ranks itself."""
        self.report = report if report is not None else log.info
        self.on_stats = on_stats
        self.plan: Plan | None = None
        self.stats: OffloadStats | None = None
        self._book = PlanBook()
        self._shapes = ShapePlanner(self._book, self._make_plan)
        self._pass: _Pass | None = None
        self._block: _Block | None = None
        self._backward_end = BackwardEnd(self._close_pass_from_backward)
        self._collector = CollectorPause(config.pause_gc)  # off from a pass's forward to its end
        self._checked_models: set[int] = set()
        self._routes: dict[int, str] = {}  # per checked model: how its plans apply (Plan.route)
        self._whole_models: dict[int, WholeModelRoute] = {}  # models compiled whole, on that route
        # Steady state (the hot path): each pass kind's save sequence, replayed by ordinal with
        # no module hooks, and the model-state bytes, recomputed only when they may change.
        self._sequences: dict[PassKey, SaveSequence] = {}
        self._sequences_recomputed: dict[PassKey, tuple[str, ...]] = {}  # the segments each ran under
        self.recomputer = SegmentRecomputer()  # the plan's recomputed segments (ops/recompute.py)
        self._host_buffer_sizes: dict[PassKey, Counter[int]] = {}  # per planned kind, its host buffers
        self._probe = SegmentProbe()  # in profiling passes: which segments could be recomputed
        self._recompute_failures = RecomputeFailures()  # segments whose recomputation failed in backward
        self._state_bytes_key: tuple[object, ...] | None = None
        self._state_bytes = 0
        self._closed = False
        self._last_entered: _Pass | None = None  # the pass that ran last (what an OOM hit)
        self._out_of_memory_retries = 0  # in a row, since the last pass that completed
        self._raised_since_agreement = 0  # reserve this rank added for overshoots since the last agreement
        self.gradient_bucket_bytes = 0  # DDP's buckets, counted as model state (count_gradient_buckets)
        self._weight_copy_bytes: dict[PassKey, int] = {}  # autocast's weight copies, per pass kind
        # Agreement between ranks (the coordinator's): requests waiting for the next agreement
        # point, each pass kind's latest measurement, and its name on every rank.
        self._requests: dict[PassKey, ReplanRequest] = {}
        self._measured: dict[PassKey, _Measured] = {}
        self._wire_keys: dict[PassKey, tuple[object, ...]] = {}
        self._model_ordinals: dict[int, int] = {}
        self._links: dict[PassKey, HostLink] = {}  # the link's rates at each pass kind's transfer sizes
        self._steady = SteadyMemo()  # replayed passes: schedules and conclusions reused while they hold
        self._unobserved_passes: dict[PassKey, int] = {}  # since the last observed one, per pass kind
        # Per pass that profiled: its profiling pass's ledger peak less its model state (no plan's
        # budget may be below that pass's peak: it runs first, in every run).
        self._profiling_activation_peaks: dict[PassKey, int] = {}
        self.allocator: AllocatorControl = (
            allocator if allocator is not None else allocator_control_for(self.device)
        )

        total, free, name = device_memory(self.device)
        self.budget_bytes: int = config.parsed_budget.resolve(total, free, device_name=name)
        self.reserve_bytes: int = (
            config.reserve_bytes
            if config.reserve_bytes is not None
            else default_reserve_bytes(self.budget_bytes, self.device.type)
        )
        if self.device.type != "cuda":
            warnings.warn(
                "lightning-accudnn on CPU: activations are copied through the host-copy backend and the "
                "budget is checked against the engine's ledger, but no memory is saved. Use a CUDA device "
                "to train beyond its memory.",
                stacklevel=2,
            )
        host_budget = config.parsed_host_memory_limit
        host_limit = (
            default_host_memory_limit(DEFAULT_HOST_MEMORY_SHARE)
            if host_budget is None
            else host_budget.resolve(host_total_bytes(), device_name="host memory")
        )
        self.engine = OffloadEngine(
            self.device,
            min_swap_bytes=config.min_swap_bytes,
            exclude=config.keep_on_device,
            host_memory_limit=host_limit,
            runtime=runtime,
        )
        # The link probe allocates device memory: before the allocator is capped (each step caps it).
        probe_host_link(self.device)
        spec = "" if config.parsed_budget.kind == "bytes" else f" ({config.budget})"
        self.report(
            f"accudnn: budget {format_bytes(self.budget_bytes)}{spec} on {name}, reserve "
            f"{format_bytes(self.reserve_bytes)}, host memory for swapped activations up to "
            f"{format_bytes(host_limit)}; the first pass profiles with every activation swapped"
        )

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
                self._probe.detach,
                self._collector.resume,
                self.engine.close,
                self._backward_end.remove,
            ):
                releases.callback(release)

    def pause_training(self) -> None:
        """Training pauses (validation, testing, prediction run next): lift the allocator cap.

        The memory fraction in force before the session capped it is back, so evaluation
        with larger batches is not held to the training budget; the next training step caps
        the allocator again.
        """
        self.allocator.lift()
        self._collector.resume()

    def count_gradient_buckets(self, wrapper: nn.Module) -> None:
        """Count ``wrapper``'s gradient buckets (a ``DistributedDataParallel``) as model state.

        See :func:`~lightning_accudnn.session.gradient_buckets.gradient_bucket_bytes` for
        what is counted; the figure is added to every pass's static memory from now on.
        """
        self.gradient_bucket_bytes = gradient_bucket_bytes(wrapper)

    def recover_from_out_of_memory(self) -> bool:
        """A pass ran out of device memory: abort it and re-plan with a larger reserve.

        Returns ``True`` when the caller may retry the step: the pass that failed ran under
        a plan, it has not failed :data:`MAX_OUT_OF_MEMORY_RETRIES` times in a row, and the
        reserve (grown by an eighth of the budget) still leaves a plan; every known plan is
        re-made with it (logged as a warning). Returns ``False`` when retrying cannot help
        (a profiling pass already runs in the least memory): the caller re-raises. A budget
        left too small by the larger reserve raises
        :class:`~lightning_accudnn.planner.BudgetTooSmallError`.
        """
        self.abort()
        failed = self._last_entered
        if failed is None or failed.plan is None or self._out_of_memory_retries >= MAX_OUT_OF_MEMORY_RETRIES:
            return False
        self._out_of_memory_retries += 1
        self.reserve_bytes += max(1, self.budget_bytes // 8)
        log.warning(
            "accudnn: device out of memory in a planned pass (retry %d of %d); reserve raised to %s, "
            "re-planned",
            self._out_of_memory_retries,
            MAX_OUT_OF_MEMORY_RETRIES,
            format_bytes(self.reserve_bytes),
        )
        for key in self._book.passes():
            plan = self._book.plan(key)
            assert plan is not None
            self._book.replan(key, self._make_plan(plan.profile, key))
        self.plan = self._book.plan(failed.key)
        return True

    def release_failed_pass(self) -> None:
        """Free what a failed pass left unreachable, before its step runs again.

        Call it once the error is gone (after the ``except`` block that caught it): the pass's
        tensors held by reference cycles (its exception's traceback frames, closures) wait for
        Python's collector, which runs here, and the CUDA allocator's cached blocks go back so
        that the retry starts from what its plan counts.
        """
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

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
        self.engine.abort_step()
        self._collector.resume()
        self.engine.weight_copies.take()  # the aborted pass's count
        self._probe.detach()
        failed = RecomputeFailures.failed_in(error, self.recomputer)
        recorded, self.recomputer.failures = self.recomputer.failures, {}
        self.recomputer.remove()  # the next pass installs its plan's segments again
        self._pass = None
        failures = dict(recorded)
        if failed is not None:
            failures[failed.segment] = failed.reason
        last = self._last_entered
        if last is not None:
            for segment, reason in failures.items():
                self._exclude_segment(last.key.model, segment, reason)
        return failed

    def _exclude_segment(self, model: int, segment: str, reason: str) -> None:
        """Keep ``segment`` of ``model`` out of its plans from now on; re-make those recomputing it."""
        if not self._recompute_failures.exclude(model, segment, reason):
            return
        log.warning(
            "accudnn: recomputing segment %r failed in backward (%s); the step was aborted, the segment "
            "is no longer recomputed and the step is re-planned",
            segment,
            reason,
        )
        for key in self._book.passes():
            plan = self._book.plan(key)
            if key.model == model and plan is not None and segment in plan.recomputed:
                self._book.replan(key, self._make_plan(plan.profile, key))
                if self.plan is plan:
                    self.plan = self._book.plan(key)

    def check_model(self, model: nn.Module, compiled_form: str | None = None) -> None:
        """Refuse what cannot train under the session, before training: lazy modules not run yet
        (their state's bytes are unknown), ``keep_on_device`` patterns matching no module, and a
        model compiled whole (regional compilation is fine)
        unless ``config.whole_model_compile`` puts it on the experimental route
        (:mod:`~lightning_accudnn.session.whole_model`). ``compiled_form`` says how ``model``
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
            self._routes[id(model)] = route_of(model)
        else:
            from lightning_accudnn.session.whole_model import WholeModelRoute

            backend = self.config.whole_model_backend
            self._whole_models[id(model)] = WholeModelRoute(backend, accelerator=self.device.type != "cpu")
            self._routes[id(model)] = ROUTE_WHOLE_MODEL
            self.report(
                f"accudnn: {form}: planned inside its compiled graph (whole_model_compile='experimental'); "
                f"training passes compile it with {backend} and the plan's partitioner, not with the backend "
                "and options it was compiled with; the first pass measures what the graph saves"
            )
        self._checked_models.add(id(model))

    def whole_model_route(self, model: nn.Module) -> WholeModelRoute | None:
        """How ``model``, compiled whole, is compiled in training passes; ``None`` on other routes."""
        return self._whole_models.get(id(model))

    @contextmanager
    def planning_alone(self) -> Iterator[None]:
        """Within the block this process plans from its own profile, with no collectives
        (the batch-size search runs each rank on its own)."""
        coordinator, self.coordinator = self.coordinator, RankCoordinator()
        alone, self.plans_alone = self.plans_alone, True
        try:
            yield
        finally:
            self.coordinator = coordinator
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
        self.allocator.cap(self.budget_bytes)
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
        plan = self._book.plan(key)
        hooked = (
            plan is None
            or self._book.needs_refining(key)
            or key not in self._sequences
            or self._sequences_recomputed.get(key) != plan.recomputed
        )
        static_bytes = self._model_state_bytes(block, refresh=hooked) + self._weight_copy_bytes.get(key, 0)
        if plan is None:  # a new batch shape: planned from other shapes of the pass if it can be
            plan = self._shapes.plan_for(key, static_bytes)
        if plan is not None and static_bytes != plan.profile.static_bytes:
            plan = self._make_plan(replace(plan.profile, static_bytes=static_bytes), key)
            self._book.replan(key, plan)
        recomputed = plan.recomputed if plan is not None else ()
        # A plan re-made just now may recompute other segments than the sequence recorded.
        hooked = hooked or self._sequences_recomputed.get(key) != recomputed
        self.plan = plan if plan is not None else self.plan
        self._pass = self._last_entered = _Pass(key, plan, self._book.source(key))
        if plan is None:
            # Profile within the host cap: what does not fit there stays (and is still measured).
            schedule = SwapSchedule.swap_everything(
                max_copying_out_bytes=SMALLEST_COPY_OUT_LIMIT, keep_beyond_host_limit=True
            )
        else:
            schedule = self._steady.schedule(key, plan)
        self.recomputer.install(block.model, recomputed, selective=plan.selective if plan is not None else ())
        self.recomputer.enabled = bool(recomputed)
        self.recomputer.last_recomputed = None
        sequence = None if hooked else self._sequences[key]
        observe = hooked or bool(recomputed) or self._observation_due(key)
        context = self.engine.offload(
            block.model, schedule, static_bytes=static_bytes, sequence=sequence, observe=observe
        )
        context.__enter__()
        self._collector.pause()  # once nothing here can fail: a pass that did not start leaves it on
        block.engine_context = context
        block.pass_closed = False
        if plan is None:
            # Inside the engine's hooks: what it sees is a segment.
            self._probe.attach(block.model, selective=self.config.policy == "selective")

    def _observation_due(self, key: PassKey) -> bool:
        """Whether this replayed pass of ``key`` must pass the engine's hooks to its end: one in
        ``config.observe_every`` is, so that a changed graph shows within that many passes (the
        others pass them up to their plan's last swapped save, or not at all when it keeps
        everything: see :meth:`OffloadEngine.offload`)."""
        count = self._unobserved_passes.get(key, 0) + 1
        due = count >= self.config.observe_every
        self._unobserved_passes[key] = 0 if due else count
        return due

    def _model_state_bytes(self, block: _Block, *, refresh: bool) -> int:
        """:func:`model_state_bytes`, walked again only in hooked passes or when the model, the
        optimizers or their number of states changed (the first optimizer step creates them)."""
        key = (
            id(block.model),
            *(id(optimizer) for optimizer in block.optimizers),
            *(len(optimizer.state) for optimizer in block.optimizers),
        )
        if refresh or key != self._state_bytes_key:
            self._state_bytes = model_state_bytes(block.model, block.optimizers)
            self._state_bytes_key = key
        return self._state_bytes + self.gradient_bucket_bytes

    def _leave_pass(self, error: BaseException | None) -> None:
        block = self._block
        if block is None or block.engine_context is None:
            return
        context, block.engine_context = block.engine_context, None
        if error is None:
            self._probe.finish_forward()
        self._probe.detach()
        self.recomputer.enabled = False
        if error is None:
            context.__exit__(None, None, None)
        else:
            self._collector.resume()
            context.__exit__(type(error), error, error.__traceback__)  # aborts the engine's step
        whole_model = self._whole_models.get(id(block.model))
        if whole_model is not None and error is None and not whole_model.planned:
            self._plan_whole_model(block, whole_model)

    def _plan_whole_model(self, block: _Block, whole_model: WholeModelRoute) -> None:
        """After the trial forward of a model compiled whole: plan from what its graph saves
        (a budget too small is refused here, before backward), and compile with the plan next."""
        key = PassKey(model=id(block.model), batch=(), position=0)  # one plan for every batch shape
        static_bytes = self._model_state_bytes(block, refresh=True)
        profile = whole_model.trial_profile(
            static_bytes, self.config.min_swap_bytes, self.config.keep_on_device
        )
        self.plan = self._make_plan(profile, key)
        whole_model.apply(self.plan)

    def _close_pass_from_backward(self) -> None:
        self._backward_end.remove()
        self._close_pass()

    def _close_pass(self) -> OffloadStats | None:
        """Measure the pass that just ran backward; plan when the ranks agree to.

        What this rank alone notices (a peak over the budget, a changed graph) waits as a
        request until the coordinator's next agreement point; a profiling or refining pass
        (every rank runs it at the same pass) is one. All ranks then plan alike, from merged
        profiles, with no collective on the other passes.
        """
        try:
            step = self.engine.end_step()
        finally:
            self._collector.resume()  # the pass's objects are freed now: nothing to promote
        current, self._pass = self._pass, None
        if step is None or current is None:
            return None
        block = self._block
        if block is not None:
            block.position += 1
            block.pass_closed = True
        key = current.key
        profiling = current.plan is None
        self._out_of_memory_retries = 0
        stats = self._measure(step, current.plan, current.source)
        self.stats = stats
        if step.sequence is not None:
            self._sequences[key] = step.sequence
            self._sequences_recomputed[key] = () if current.plan is None else current.plan.recomputed
            self._links.pop(key, None)
        # Autocast's weight copies (kept, never swapped) are model state: a hooked pass's own count
        # replaces the one its static bytes started from (a replayed pass leaves them to autograd
        # unlooked-at, as its profiled pass found them: that count stands).
        copies = self.engine.weight_copies.take()
        if step.sequence is None:
            copies = self._weight_copy_bytes.get(key, 0)
        static_bytes = self.engine.ledger.static_bytes - self._weight_copy_bytes.get(key, 0) + copies
        self._weight_copy_bytes[key] = copies
        known = self._book.plan(key)
        profile, changed = self._conclude(step, key, static_bytes, current.plan, known)
        usable = self.budget_bytes - self.reserve_bytes
        overshoot = 0 if profiling else self._overshoot(stats, usable)
        if step.graph_changed:
            # Replayed by ordinal, the graph departed from its sequence: the next pass of this
            # kind runs hooked, and its layers (which then differ) are planned from.
            self._sequences.pop(key, None)
            overshoot, changed = 0, False
        self._measured[key] = _Measured(profile, None if step.timed else known, planned=not profiling)
        self._wire_keys.setdefault(key, (self._model_ordinal(key.model), key.batch, key.position))
        scheduled = profiling or self._book.needs_refining(key)
        request = ReplanRequest(replan=changed or scheduled)
        if overshoot:
            # The reserve grows at once, on this rank (its next pass must not pass the budget
            # again while it waits for an agreement point); the request carries all this rank
            # raised since the last one, so that the agreement leaves every rank with as much.
            self._raise_reserve(overshoot, "the pass's peak passed the usable budget")
            self._raised_since_agreement += overshoot
            request = ReplanRequest(replan=True, overshoot_bytes=self._raised_since_agreement)
            scheduled = True
        if request:
            self._requests[key] = self._requests.get(key, ReplanRequest()) | request
        if self.coordinator.due():
            self._agree(key)
        elif scheduled:
            # Between agreement points a profiling or refining pass (or one over the budget) is
            # planned from this rank's own figures (ranks may see other batch shapes); the next
            # agreement merges them.
            self._keep_new_plan(key, self._measured[key].profile_to_plan(), current=True)
        if self.on_stats is not None:
            self.on_stats(stats)
        return stats

    def _conclude(
        self, step: StepStats, key: PassKey, static_bytes: int, plan: Plan | None, known: Plan | None
    ) -> tuple[StepProfile, bool]:
        """The profile to plan ``key`` from after ``step`` ran under ``plan``, and whether it
        departs from ``known`` (the plan kept for it); a replayed pass that measured what the
        last one did reuses its conclusions (:class:`SteadyMemo`)."""
        replayed = not step.timed and not step.graph_changed
        sources = (plan, known, self._links.get(key))
        if replayed:
            reused = self._steady.conclusion(key, step.layers, static_bytes, sources)
            if reused is not None:
                return reused
        else:
            self._steady.forget(key)
        profile = self._profile_from(step, key, static_bytes)
        if plan is None:
            segments = recomputable_segments(self._probe.segments(), step.layers_read_in_forward)
            profile = replace(profile, segments=segments, excluded_segments=self._probe.excluded())
            self._profiling_activation_peaks[key] = step.ledger_peak_bytes - self.engine.ledger.static_bytes
        profile = profile_to_plan_from(plan, profile, step.graph_changed)
        changed = known is not None and self._book.departs(key, profile)
        if replayed:
            self._steady.remember(key, step.layers, static_bytes, sources, profile, departs=changed)
        return profile, changed

    def _overshoot(self, stats: OffloadStats, usable: int) -> int:
        """How far a planned pass went past its room: its ledger over the usable budget (the
        plan's estimate fell short), plus what the ledger does not see (workspaces, gradients
        in flight: the allocated peak less the ledger's) beyond the reserve, which is kept for
        that and for the allocator's fragmentation.

        Not the allocator's reserved bytes: under the cap it frees its cache and retries
        before it fails, and the cache left by earlier passes does not shrink with a smaller
        plan (on an H100, reserved bytes raised the reserve pass after pass until ResNet-18 at
        batch 32 was refused 1.5 GB, 1.6 times its plain allocated peak). A pass that does not
        fit fails with an out-of-memory error instead (:meth:`recover_from_out_of_memory`).
        """
        unseen = max(0, stats.peak_device_bytes - stats.ledger_peak_bytes)
        return max(0, stats.ledger_peak_bytes - usable) + max(0, unseen - self.reserve_bytes)

    def _agree(self, last: PassKey) -> None:
        """An agreement point: merge every rank's requests, re-plan the passes they name."""
        requests, self._requests = self._requests, {}
        raised, self._raised_since_agreement = self._raised_since_agreement, 0
        agreed = self.coordinator.agree({self._wire_keys[key]: request for key, request in requests.items()})
        if not agreed:
            return
        # Every rank ends with the reserve of the rank that raised it most since the last agreement.
        catch_up = max(request.overshoot_bytes for request in agreed.values()) - raised
        if catch_up > 0:
            self._raise_reserve(catch_up, "another rank's pass passed its usable budget")
        keys: dict[Hashable, PassKey] = {wire: key for key, wire in self._wire_keys.items() if wire in agreed}
        profiles = self.coordinator.merge(
            {wire: self._measured[key].profile_to_plan() for wire, key in keys.items()}
        )
        for wire, profile in profiles.items():
            key = keys[wire]
            self._keep_new_plan(key, profile, current=key == last)

    def _raise_reserve(self, nbytes: int, why: str) -> None:
        usable = self.budget_bytes - self.reserve_bytes
        self.reserve_bytes += nbytes
        log.warning(
            "accudnn: %s %s by %s; reserve raised to %s, re-planned",
            why,
            format_bytes(usable),
            format_bytes(nbytes),
            format_bytes(self.reserve_bytes),
        )

    def _keep_new_plan(self, key: PassKey, profile: StepProfile, *, current: bool) -> None:
        """Plan ``key`` from ``profile`` (its last pass's measurements, merged across ranks or not)."""
        plan = self._make_plan(profile, key)
        sequence = self._sequences.get(key)
        if sequence is not None:
            self._reserve_host_buffers(key, swapped_buffer_sizes(sequence, plan.swapped_layers))
        self._book.keep(key, plan, PlanSource.REFINED if self._measured[key].planned else PlanSource.PROFILED)
        if current:
            self.plan = plan

    def _reserve_host_buffers(self, key: PassKey, sizes: list[int]) -> None:
        """Have the pool hold, idle, the buffers the planned passes of every kind need (the
        most any one kind holds at once, per size): they allocate none in forward, and what
        the profiling pass pinned beyond that goes back to the system."""
        self._host_buffer_sizes[key] = Counter(self.engine.pool.host_bytes(nbytes) for nbytes in sizes)
        needed: Counter[int] = Counter()
        for counts in self._host_buffer_sizes.values():
            needed |= counts
        self.engine.pool.reserve(needed.elements())

    def _model_ordinal(self, model: int) -> int:
        """The model's number in the order this session met it (the same on every rank)."""
        return self._model_ordinals.setdefault(model, len(self._model_ordinals))

    # -- planning and measuring ----------------------------------------------------------

    def _make_plan(self, profile: StepProfile, key: PassKey) -> Plan:
        """The fastest plan under the budget. The planner's smallest budget does not depend on
        the budget asked or on the timings, so a budget an error named always plans.

        No plan's budget is below the peak of the profiling passes this pass ran in this run
        (at this batch shape or another; the first runs first in every run): their largest
        measured activation peak over ``profile``'s model state, whatever pass ``profile`` came
        from (profiling, refining, merged across ranks, scaled from another shape). A shape
        planned from another's profile never profiles, so its own computed peak of swapping
        everything is not its floor: a scaled plan may recompute below it. With no profiling
        pass known, the planner computes the floor."""
        budget = self.budget_bytes
        profile = self._recompute_failures.applied(key.model, profile)
        profiling_peak = self._profiling_peak(key, profile.static_bytes)
        pool = self.engine.pool
        host_bytes = layer_host_bytes(
            profile, self._sequences.get(key), self.config.min_swap_bytes, pool.host_bytes
        )
        try:
            plan = plan_swaps(
                profile,
                budget,
                self.reserve_bytes,
                policy=self.config.policy,
                host_limit_bytes=pool.capacity_bytes,
                host_bytes=host_bytes,
                profiling_peak_bytes=profiling_peak,
            )
        except HostLimitTooSmallError as error:
            raise HostMemoryExceeded(str(error)) from error
        except BudgetTooSmallError as error:
            enough = error.with_host_memory_for_all_bytes
            if enough is None or budget < enough:
                raise
            # The budget would do but for the host limit: the profiling pass kept on the device
            # what the host pool could not take.
            needed = sum(host_bytes)
            raise HostMemoryExceeded(
                f"the host-memory limit of {format_bytes(pool.capacity_bytes)} is too small for this "
                f"training step: the profiling pass (the first pass of a new batch shape swaps every "
                f"activation) kept on the device what it could not hold and needed "
                f"{format_bytes(error.min_budget_bytes)} of device memory, over the budget of "
                f"{format_bytes(budget)}. Raise host_memory_limit by at least "
                f"{format_bytes(max(1, needed - pool.capacity_bytes))} (to {format_bytes(needed)}, "
                f"every activation), or raise the budget to at least {format_bytes(error.min_budget_bytes)}."
            ) from error
        plan = replace(plan, route=self._routes.get(key.model, ROUTE_EAGER))
        which = f" (pass {key.position + 1} of the step)" if key.position else ""
        self.report(
            f"accudnn plan{which}: swap {len(plan.swapped_layers)} of {len(profile.layers)} layers "
            f"({format_bytes(plan.swapped_bytes)} of {format_bytes(profile.saved_bytes)} saved), "
            f"recompute {len(plan.recomputed)} segments, "
            f"predicted peak {format_bytes(plan.predicted_peak_bytes)} of budget {format_bytes(budget)}, "
            f"step {plan.predicted_step_seconds * 1e3:.1f} ms, bound ratio {plan.bound_ratio:.2f}"
        )
        return plan

    def _profiling_peak(self, key: PassKey, static_bytes: int) -> int | None:
        """The largest measured peak of the profiling passes of ``key``'s pass (any batch shape),
        with ``static_bytes`` of model state; ``None`` when none profiled on this rank."""
        peaks = [
            peak
            for other, peak in self._profiling_activation_peaks.items()
            if other == key or same_pass_other_shape(other, key)
        ]
        return static_bytes + max(peaks) if peaks else None

    def _profile_from(self, step: StepStats, key: PassKey, static_bytes: int) -> StepProfile:
        """The pass's profile, with the host link's rates at the sizes of its swappable storages."""
        link = self._links.get(key)
        if link is None:
            sizes = transfer_sizes(self._sequences.get(key), self.config.min_swap_bytes)
            link = self._links[key] = probe_host_link(self.device).link_for(sizes)
        return StepProfile(
            layers=step.layers,
            static_bytes=static_bytes,
            d2h_bytes_per_second=link.d2h_bytes_per_second,
            h2d_bytes_per_second=link.h2d_bytes_per_second,
            resaves_listed=True,  # the engine lists every re-save of a swappable storage
        )

    def _measure(self, step: StepStats, plan: Plan | None, source: PlanSource) -> OffloadStats:
        peaks = self.allocator.peaks()
        peak, reserved = (step.ledger_peak_bytes, step.ledger_peak_bytes) if peaks is None else peaks
        return OffloadStats(
            bytes_swapped_out=step.bytes_swapped_out,
            bytes_swapped_in=step.bytes_swapped_in,
            wait_seconds=step.wait_seconds,
            peak_device_bytes=peak,
            peak_reserved_bytes=reserved,
            ledger_peak_bytes=step.ledger_peak_bytes,
            swapped_layers=step.swapped_layers,
            profiling=plan is None,
            step_seconds=step.forward_seconds + step.backward_seconds,
            predicted_peak_bytes=None if plan is None else plan.predicted_peak_bytes,
            predicted_step_seconds=None if plan is None else plan.predicted_step_seconds,
            plan_source=source,
            observed=step.observed,
            storages_swapped_out=step.storages_swapped_out,
        )


def is_lazy(parameter: torch.Tensor) -> bool:
    """Whether ``parameter`` belongs to a lazy module not run yet (its shape is not known).

    Example:
        >>> is_lazy(nn.LazyLinear(4).weight), is_lazy(nn.Linear(2, 4).weight)
        (True, False)
    """
    return isinstance(parameter, nn.parameter.UninitializedParameter)


def host_total_bytes() -> int:
    """The machine's RAM (what a ``host_memory_limit`` share such as ``"25%"`` is a share of)."""
    return int(psutil.virtual_memory().total)


def _with_times_of(
    layers: tuple[LayerProfile, ...], timed: tuple[LayerProfile, ...]
) -> tuple[LayerProfile, ...]:
    """The layers of an untimed pass with the times, and the re-saves, an earlier, timed pass
    of it measured (a pass replayed by ordinal sees neither)."""
    by_name = {layer.name: layer for layer in timed}
    return tuple(
        replace(
            layer,
            forward_seconds=by_name[layer.name].forward_seconds,
            backward_seconds=by_name[layer.name].backward_seconds,
            resaved_by=by_name[layer.name].resaved_by,
        )
        if layer.name in by_name
        else layer
        for layer in layers
    )
