"""One training pass after another: its plan and schedule, the engine around it, what it measured.

:class:`PassRunner` is the session's loop body. Entering a pass picks the plan its kind keeps
(or one scaled from another batch shape, or none: a profiling pass), the engine's schedule and
whether the engine's module hooks run; closing it measures the pass, concludes the profile to
plan from, grows the reserve when the pass went past its room and plans when the ranks agree
to (:class:`~lightning_accudnn.session.agreement.PlanAgreement`). The session around it tells
passes apart, checks the models and recovers from failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, StepStats
from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.ops.recomputation_scope import scratch_statistics_bytes
from lightning_accudnn.ops.recompute import SegmentProbe, SegmentRecomputer
from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.planner.plan import ROUTE_EAGER
from lightning_accudnn.profiling.bandwidth import LinkCurve
from lightning_accudnn.session.agreement import Measured, PlanAgreement, with_most_working_memory
from lightning_accudnn.session.allocator import AllocatorControl
from lightning_accudnn.session.background_plans import BackgroundPlans
from lightning_accudnn.session.collector_pause import CollectorPause
from lightning_accudnn.session.coordination import ReplanRequest
from lightning_accudnn.session.host_buffers import HostBufferReservation
from lightning_accudnn.session.out_of_memory import (
    MAX_OUT_OF_MEMORY_RETRIES,
    OutOfMemoryAfterRetriesError,
    OutOfMemoryRetries,
    ProfilingPassOutOfMemoryError,
)
from lightning_accudnn.session.pass_records import PassRecords
from lightning_accudnn.session.plan_book import PassKey, PlanBook, PlanSource
from lightning_accudnn.session.planning import SessionPlanning
from lightning_accudnn.session.recompute_failures import RecomputeFailures
from lightning_accudnn.session.recompute_pass import profile_to_plan_from, recomputable_segments
from lightning_accudnn.session.shapes import ShapePlanner
from lightning_accudnn.session.shortfall import PredictionShortfall
from lightning_accudnn.session.stats import OffloadStats, measured_stats
from lightning_accudnn.session.steady_costs import SteadyCosts
from lightning_accudnn.session.transfers import swapped_buffer_sizes
from lightning_accudnn.session.warm_times import (
    compute_departs,
    fastest_times,
    recompute_cost_departs,
    scaled_backward,
    scaled_to_forward,
    swap_host_departs,
)

__all__ = ["PassRunner", "RunningPass"]


@dataclass
class RunningPass:
    """The forward/backward pass in progress: which one it is and what it runs under.

    Example:
        >>> import torch
        >>> key = PassKey(model=1, batch=(((8, 3), torch.float32),), position=0)
        >>> RunningPass(key, plan=None, source=PlanSource.PROFILING).plan is None  # profiling
        True
    """

    key: PassKey
    plan: Plan | None  # None: a profiling pass
    source: PlanSource  # how the plan was made


class PassRunner:
    """Runs the passes of one session under the plans it keeps, one pass kind at a time.

    ``probe`` is the host link's probe (called at a pass kind's first profile);
    ``selective_probe`` whether profiling passes measure selective recomputation;
    ``plan_in_background`` whether plans that only refine a kind's plan are made on a thread
    thread (:class:`~lightning_accudnn.session.background_plans.BackgroundPlans`) and adopted by
    the first pass of the kind that starts after they are ready.

    Example:
        >>> from lightning_accudnn.planner.headroom import Headroom
        >>> from lightning_accudnn.profiling.bandwidth import probe_host_link
        >>> from lightning_accudnn.session.coordination import RankCoordinator
        >>> from lightning_accudnn.session.allocator import NoAllocatorControl
        >>> device = torch.device("cpu")
        >>> engine = OffloadEngine(device, min_swap_bytes=0, host_memory_limit=10**8)
        >>> records = PassRecords(device, min_swap_bytes=0, observe_every=8)
        >>> planning = SessionPlanning(Headroom(10**9), engine, policy="auto", min_swap_bytes=0,
        ...                            report=lambda line: None)
        >>> runner = PassRunner(engine, records, planning, PlanAgreement(RankCoordinator()),
        ...                     NoAllocatorControl(), CollectorPause(True), probe_host_link)
        >>> model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        >>> key = PassKey(model=id(model), batch=(), position=0)
        >>> for _ in range(2):
        ...     context = runner.enter(model, (), key)
        ...     loss = model(torch.randn(32, 64)).square().mean()
        ...     runner.leave(context, None)
        ...     engine.begin_backward(); loss.backward()
        ...     step, current = runner.end()
        ...     stats = runner.conclude(step, current)
        >>> stats.profiling, runner.plan is not None
        (False, True)
    """

    def __init__(
        self,
        engine: OffloadEngine,
        records: PassRecords,
        planning: SessionPlanning,
        agreement: PlanAgreement,
        allocator: AllocatorControl,
        collector: CollectorPause,
        probe: Callable[[torch.device], LinkCurve],
        *,
        selective_probe: bool = False,
        plan_in_background: bool = False,
        on_stats: Callable[[OffloadStats], None] | None = None,
    ) -> None:
        self.engine = engine
        self.records = records
        self.planning = planning
        self.agreement = agreement
        self.allocator = allocator
        self.collector = collector
        self.probe = probe
        self.selective_probe = selective_probe
        self.plan_in_background = plan_in_background
        self.background_plans = BackgroundPlans()
        self.on_stats = on_stats
        self.book = PlanBook()
        self.shapes = ShapePlanner(self.book, self.make_plan)
        self.host_buffers = HostBufferReservation(engine)
        self.routes: dict[int, str] = {}  # per checked model: how its plans apply (Plan.route)
        self.recomputer = SegmentRecomputer()  # the plan's recomputed segments (ops/recompute.py)
        self._scratch: tuple[int, int] = (0, 0)  # (id of the model, its scratch statistics' bytes)
        self.segment_probe = SegmentProbe()  # in profiling passes: which segments could be recomputed
        self.plan: Plan | None = None
        self.stats: OffloadStats | None = None
        self.gradient_bucket_bytes = 0  # DDP's buckets, counted as model state
        self.buffer_snapshot_bytes = 0  # the copy of the buffers a retry starts from, likewise
        self.current: RunningPass | None = None
        self.last_entered: RunningPass | None = None  # the pass that ran last (what an OOM hit)
        self.out_of_memory_retries = OutOfMemoryRetries()
        #: Reads the allocator's peaks in hooked passes, which then measure their working memory
        #: (``None`` without an allocator that can: plans count the ledger's bytes only).
        self.allocated_peak = allocator.allocated_peak_reader()
        #: What the allocator held above the plans' predictions, added to the next ones.
        self.shortfall = PredictionShortfall(measured=self.allocated_peak is not None)
        self._planning_seconds = 0.0  # spent making plans at the end of the pass concluding now
        self._background_seconds = 0.0  # the thread's time making the plan the current pass adopted
        self._adopted_seconds: dict[PassKey, float] = {}  # adopted before a pass: its thread's time
        # Per pass kind whose refinement waits for its last timed pass: the fastest times so far.
        self._warm_profiles: dict[PassKey, StepProfile] = {}
        self.steady_costs = SteadyCosts(engine.timer.clock)  # the steady state's forward and recomputations

    def refining(self, key: PassKey) -> bool:
        """Whether ``key``'s next pass is timed to refine its plan: the plan needs refining
        (:meth:`PlanBook.needs_refining`) and no refined plan is in the making for it."""
        return self.book.needs_refining(key) and not self.background_plans.waiting(key)

    def make_plan(self, profile: StepProfile, key: PassKey) -> Plan:
        """The fastest plan for ``key`` under the headroom (:meth:`SessionPlanning.make_plan`)."""
        route = self.routes.get(key.model, ROUTE_EAGER)
        return self.planning.make_plan(profile, key, self.records.sequence(key), route)

    def model_state_bytes(
        self, model: nn.Module, optimizers: tuple[torch.optim.Optimizer, ...], *, refresh: bool
    ) -> int:
        """The model's state (:meth:`PassRecords.model_state_bytes`), DDP's gradient buckets, the
        copy of the buffers a retried step starts from, and the scratch statistics recomputations
        may keep (:meth:`scratch_bytes`)."""
        state = self.records.model_state_bytes(model, optimizers, refresh=refresh)
        scratch = self.scratch_bytes(model, refresh=refresh)
        return state + self.gradient_bucket_bytes + self.buffer_snapshot_bytes + scratch

    def scratch_bytes(self, model: nn.Module, *, refresh: bool) -> int:
        """The most scratch statistics recomputations may keep on the device (a training norm's
        running statistics, copied once per recomputed segment and kept while it stays
        recomputed: :func:`~lightning_accudnn.ops.recomputation_scope.scratch_statistics_bytes`),
        under a policy that may recompute; walked again only when ``refresh`` or for another model."""
        if self.planning.policy == "swap":
            return 0
        if refresh or self._scratch[0] != id(model):
            self._scratch = (id(model), scratch_statistics_bytes(model))
        return self._scratch[1]

    def scratch_to_come_bytes(self) -> int:
        """Of :meth:`scratch_bytes`, what the recomputations have not made (yet)."""
        return max(0, self._scratch[1] - self.recomputer.scratch_bytes())

    # -- a pass ---------------------------------------------------------------------------

    def enter(
        self, model: nn.Module, optimizers: tuple[torch.optim.Optimizer, ...], key: PassKey
    ) -> AbstractContextManager[None]:
        """Start ``key``'s pass of ``model``: returns the engine's context, entered."""
        self._adopt_ready_plan(key)
        self._background_seconds = self._adopted_seconds.pop(key, 0.0)
        plan = self.book.plan(key)
        records = self.records
        hooked = records.hooked(key, plan, refining=self.refining(key))
        static_bytes = self.model_state_bytes(model, optimizers, refresh=hooked) + records.weight_copy_bytes(
            key
        )
        if plan is None:  # a new batch shape: planned from other shapes of the pass if it can be
            plan = self.shapes.plan_for(key, static_bytes)
        if plan is not None and static_bytes != plan.profile.static_bytes:
            plan = self.make_plan(replace(plan.profile, static_bytes=static_bytes), key)
            self.book.replan(key, plan)
        recomputed = plan.recomputed if plan is not None else ()
        # A plan re-made just now may recompute other segments than the sequence recorded.
        hooked = hooked or not records.ran_under(key, recomputed)
        self.plan = plan if plan is not None else self.plan
        self.current = self.last_entered = RunningPass(key, plan, self.book.source(key))
        schedule = records.schedule(key, plan)
        self.recomputer.install(model, recomputed, selective=plan.selective if plan is not None else ())
        self.recomputer.enabled = bool(recomputed)
        self.recomputer.last_recomputed = None
        sequence = None if hooked else records.sequence(key)
        costs = self.steady_costs
        timed = costs.begin_pass(
            key, plan, hooked=sequence is None, contended=self.background_plans.in_making()
        )
        self.recomputer.timing = costs.timer_for(plan, hooked=sequence is None, timed=timed)
        # A plan that recomputes selectively and swaps too is observed whole: selective
        # recomputation calls the engine's hooks from under its own, where they could not go in
        # the middle of the pass. Unobserved, one that recomputes whole segments drops them
        # after its last swapped save, as a plan that only swaps does (none if it swaps nothing).
        selective_swaps = plan is not None and bool(plan.selective) and any(plan.swap)
        observe = hooked or selective_swaps or records.observation_due(key)
        context = self.engine.offload(
            model,
            schedule,
            static_bytes=static_bytes,
            sequence=sequence,
            observe=observe,
            time_waits=timed,
            allocated_peak=self.allocated_peak,
        )
        context.__enter__()
        self.collector.pause()  # once nothing here can fail: a pass that did not start leaves it on
        if plan is None:
            # Inside the engine's hooks: what it sees is a segment.
            self.segment_probe.attach(
                model, selective=self.selective_probe, records_of=self.engine.records_of
            )
        return context

    def leave(self, context: AbstractContextManager[None], error: BaseException | None) -> None:
        """The forward of the pass ``context`` runs ended (with ``error``, which aborts the engine's step)."""
        if error is None:
            self.segment_probe.finish_forward()
        self.segment_probe.detach()
        self.recomputer.enabled = False
        try:
            if error is None:
                context.__exit__(None, None, None)
            else:
                self.collector.resume()
                context.__exit__(type(error), error, error.__traceback__)
        finally:
            # Once the engine's forward is over (it found what the model holds past it); the
            # probe lets the engine's records go, whatever happened.
            self.segment_probe.settle_inputs()

    def end(self) -> tuple[StepStats, RunningPass] | None:
        """The pass's backward ended: the engine's figures and the pass, or ``None`` when none was open."""
        try:
            step = self.engine.end_step()
        finally:
            self.collector.resume()  # the pass's objects are freed now: nothing to promote
        timing, self.recomputer.timing = self.recomputer.timing, None
        current, self.current = self.current, None
        if step is None or current is None:
            if timing is not None:
                timing.discard()
            return None
        self.steady_costs.pass_ended(current.key, current.plan, timing, step)
        return step, current

    def conclude(self, step: StepStats, current: RunningPass) -> OffloadStats:
        """Measure the pass that just ran backward; plan when the ranks agree to.

        What this rank alone notices (a peak over the budget, a changed graph) waits as a
        request until the coordinator's next agreement point; a profiling or refining pass
        (every rank runs it at the same pass) is one. All ranks then plan alike, from merged
        profiles, with no collective on the other passes.
        """
        key = current.key
        profiling = current.plan is None
        self.out_of_memory_retries.reset()
        peaks = self.allocator.peaks()
        shortfall = self.shortfall.for_plan(current.plan)
        stats = self.stats = measured_stats(step, peaks, current.plan, current.source, shortfall)
        if peaks is not None:  # later predictions count what this pass held beyond its own
            self.shortfall.note(
                current.plan, ledger_peak_bytes=step.ledger_peak_bytes, allocated_peak_bytes=peaks[0]
            )
        copies = self.engine.weight_copies.take()
        static_bytes = self.records.record(key, step, current.plan, copies, self.engine.ledger.static_bytes)
        known = self.book.plan(key)
        costs = self.steady_costs
        if costs.timing(key):
            self.records.steady.forget(key)  # its conclusions charged the times before
        profile, changed = self._profile_to_plan(step, key, static_bytes, current.plan, known)
        # A planned pass past its room (see Headroom.overshoot); not the allocator's reserved bytes.
        room = self.planning.headroom
        overshoot = 0 if profiling else room.overshoot(stats.peak_device_bytes)
        graph_changed = step.graph_changed
        if graph_changed:
            # Replayed by ordinal, the graph departed from its sequence: the next pass of this
            # kind runs hooked, and its layers (which then differ) are planned from. This pass
            # lists its saves from the departure on as one layer: nothing is planned from it.
            self.records.forget_sequence(key)
            overshoot, changed = 0, False
        times_of = None if step.timed else known  # an untimed pass borrows the plan's layer times
        if self.steady_costs.recost_due(key) and current.plan is not None and not graph_changed:
            if times_of is not None:
                profile = self.steady_costs.charged(
                    key, Measured(profile, times_of, planned=True).profile_to_plan()
                )
                times_of = None
            recost = self._recosted(current.plan, profile)
            if recost:
                self.steady_costs.recosted(key)
        else:
            recost = False
        scheduled = (profiling or self.refining(key)) and not graph_changed
        if step.timed and not profiling:
            self.book.note_timed(key)
        # Only refining: the plan in force still holds, so the new one may be made meanwhile. A
        # re-cost waits for the agreement point (the steady passes each rank times differ).
        refining = (scheduled or recost) and not profiling and not changed
        request = ReplanRequest(replan=changed or scheduled or recost, refine_only=refining)
        if overshoot:
            # The reserve grows at once, on this rank (its next pass must not pass the budget
            # again while it waits for an agreement point); the agreement leaves every rank with
            # as much as the rank that raised it most.
            self.planning.raise_reserve(overshoot, "a planned pass's peak passed the usable budget")
            request = self.agreement.overshoot(overshoot)
            scheduled, refining = True, False
        measured = Measured(profile, times_of, planned=not profiling)
        if not graph_changed:
            self.agreement.record(key, measured, request)
        self._planning_seconds = 0.0
        if self.agreement.due():
            agreed = self.agreement.agree()
            if agreed.catch_up_bytes:
                self.planning.raise_reserve(
                    agreed.catch_up_bytes, "another rank's pass passed its usable budget"
                )
            # Where other ranks run the plans agreed here, each is made at once: every rank then
            # runs it from the next pass (a plan made on a thread is adopted by the first pass
            # after it is ready, a pass of each rank's own).
            alone = not self.agreement.coordinator.shared
            for other, merged in agreed.profiles.items():
                background = alone and other in agreed.refine_only
                self._keep_new_plan(other, merged, current=other == key, in_background=background)
        elif scheduled:
            # Between agreement points a profiling or refining pass (or one over the budget) is
            # planned from this rank's own figures (ranks may see other batch shapes); the next
            # agreement merges them.
            self._keep_new_plan(key, measured.profile_to_plan(), current=True, in_background=refining)
        ratio = costs.ratio(key, profile)
        host = costs.host_seconds_per_storage(key)
        if costs.timing(key) or ratio is not None or host is not None:
            stats = self.stats = replace(
                stats,
                steady_timing=costs.timing(key),
                recompute_cost_ratio=ratio,
                host_seconds_per_swapped_storage=host,
            )
        if self._planning_seconds or self._background_seconds:
            stats = self.stats = replace(
                stats,
                planning_seconds=self._planning_seconds,
                background_planning_seconds=self._background_seconds,
            )
        if self.on_stats is not None:
            self.on_stats(stats)
        return stats

    def _profile_to_plan(
        self, step: StepStats, key: PassKey, static_bytes: int, plan: Plan | None, known: Plan | None
    ) -> tuple[StepProfile, bool]:
        """The profile to plan ``key`` from after ``step`` ran under ``plan``, and whether it
        departs from ``known`` (the plan kept for it); a replayed pass that measured what the
        last one did reuses its conclusions (:class:`~lightning_accudnn.session.steady_memo.SteadyMemo`)."""
        replayed = not step.timed and not step.graph_changed
        steady = self.records.steady
        sources = (plan, known, self.records.link(key))
        if replayed:
            reused = steady.conclusion(key, step.layers, static_bytes, sources)
            if reused is not None:
                return reused
        else:
            steady.forget(key)
        records, measured_against = self.records, self.engine.ledger.static_bytes
        # Model state the allocator does not hold yet: the optimizers' state before their first
        # step, the scratch statistics before the recomputations that make them.
        allocator_read = self.allocated_peak is not None
        not_allocated = records.state_to_come_bytes + self.scratch_to_come_bytes() if allocator_read else 0
        profile = records.profile_from(
            step,
            key,
            static_bytes,
            self.probe,
            measured_against=measured_against,
            not_allocated=not_allocated,
        )
        if (
            allocator_read
            and records.state_to_come_bytes
            and records.first_step_temporaries_bytes > profile.outside_working_bytes
        ):
            # The optimizer has not stepped: its first step, under the budget after this pass,
            # holds what no pass measured yet.
            profile = replace(profile, outside_working_bytes=records.first_step_temporaries_bytes)
        if plan is None:
            probe = self.segment_probe
            segments = recomputable_segments(probe.segments(), step.layers_read_in_forward)
            profile = replace(profile, segments=segments, excluded_segments=probe.excluded())
            records.note_swapped_pass(key, step, profile)
            # With its working memory measured, the pass needed what the allocator held (autocast's
            # weight copies among it, which the static memory counts from now on), and the model
            # state to come; else what the ledger held, beside its static memory.
            stats = self.stats
            measured = self.allocated_peak is not None and stats is not None
            peak = stats.peak_device_bytes if measured and stats is not None else step.ledger_peak_bytes
            held_static = static_bytes - not_allocated if measured else measured_against
            self.planning.note_profiling_peak(key, peak - held_static)
        profile = profile_to_plan_from(plan, profile, step.graph_changed)
        if step.timed and plan is not None and known is not None:
            # Warm passes are faster: each layer keeps its fastest time (a plan that recomputes
            # keeps its own profile, whose forward alone this pass can compare).
            if profile is plan.profile:
                profile = scaled_to_forward(profile, step.forward_seconds)
                plain = self.steady_costs.plain_backward(key, step.backward_seconds)
                profile = scaled_backward(profile, plain)
            else:
                profile = fastest_times(profile, self._warm_profiles.get(key, known.profile))
        profile = self.steady_costs.charged(key, profile)
        if step.outside_working_bytes > profile.outside_working_bytes:
            # The optimizer's temporaries, measured after its first step (a plan's own profile,
            # which a plan that recomputes keeps, is from a profiling pass: none before it).
            profile = replace(profile, outside_working_bytes=step.outside_working_bytes)
        if step.timed and known is not None:
            profile = with_most_working_memory(profile, known.profile)
        profile = records.with_swapped_pass(key, profile)
        changed = known is not None and self.book.departs(key, profile)
        if replayed:
            steady.remember(key, step.layers, static_bytes, sources, profile, departs=changed)
        return profile, changed

    @staticmethod
    def _recosted(plan: Plan, profile: StepProfile) -> bool:
        """Whether ``plan``, just timed in full (:meth:`SteadyCosts.recost_due`), misjudges the
        compute, the recomputation or the host's time per swapped storage ``profile`` (planned
        from next) charges by too much (:func:`~lightning_accudnn.session.warm_times.compute_departs`,
        :func:`~lightning_accudnn.session.warm_times.recompute_cost_departs`,
        :func:`~lightning_accudnn.session.warm_times.swap_host_departs`): it is made again."""
        return (
            compute_departs(plan, profile)
            or recompute_cost_departs(plan, profile)
            or swap_host_departs(plan, profile)
        )

    def _keep_new_plan(
        self, key: PassKey, profile: StepProfile, *, current: bool, in_background: bool = False
    ) -> None:
        """Plan ``key`` from ``profile`` (its last pass's measurements, merged across ranks or not).

        ``in_background`` when the plan only refines the one in force: with
        :attr:`plan_in_background`, that plan then stays in force, and its passes are timed,
        until :data:`~lightning_accudnn.session.warm_times.TIMED_PLANNED_PASSES` planned passes
        were; the plan from them is made on a thread and adopted when ready. The passes timed
        are those :attr:`plan_in_background` ``False`` times."""
        started = time.perf_counter()
        planned = self.agreement.measured(key).planned
        if in_background and planned and self.plan_in_background and self.book.plan(key) is not None:
            # Until the last timed pass the plan in force runs (timed) on: one plan, from them all.
            if self.book.timed_enough(key):
                self._warm_profiles.pop(key, None)
                route = self.routes.get(key.model, ROUTE_EAGER)
                job = self.planning.plan_job(profile, key, self.records.sequence(key), route)
                self.background_plans.submit(key, job, made_under=self.planning.headroom)
            else:
                self._warm_profiles[key] = profile
        else:
            self.background_plans.drop(key)  # made from older figures, or under another headroom
            self._warm_profiles.pop(key, None)
            plan = self.make_plan(profile, key)
            self._adopt(key, plan, PlanSource.REFINED if planned else PlanSource.PROFILED)
            if current:
                self.plan = plan
        self._planning_seconds += time.perf_counter() - started

    def wait_for_plans(self) -> None:
        """Wait for every plan in the making, and adopt each (the plan in force too)."""
        self.background_plans.wait_all()
        for key in self.book.passes():
            self._adopt_ready_plan(key)
        last = self.last_entered
        if last is not None and self.book.plan(last.key) is not None:
            self.plan = self.book.plan(last.key)

    def _adopt_ready_plan(self, key: PassKey) -> None:
        """Adopt ``key``'s plan made on a thread, if it is ready (and was made under the
        headroom in force: else it is forgotten, and the next pass refines again)."""
        ready = self.background_plans.take(key, made_under=self.planning.headroom)
        if ready is None:
            return
        self.planning.report_plan(ready.plan, key)
        self._adopt(key, ready.plan, PlanSource.REFINED)
        self._adopted_seconds[key] = ready.seconds

    def _adopt(self, key: PassKey, plan: Plan, source: PlanSource) -> None:
        """Keep ``plan`` for ``key``, its host buffers reserved."""
        sequence = self.records.sequence(key)
        if sequence is not None:
            self.host_buffers.reserve(key, swapped_buffer_sizes(sequence, plan.swapped_layers))
        self.book.keep(key, plan, source)

    # -- failures -------------------------------------------------------------------------

    def abort(self, error: BaseException | None) -> RecomputationError | None:
        """The pass failed: drop its swapped activations; keep a segment whose recomputation
        failed out of the model's plans (see :meth:`OffloadSession.abort`)."""
        self.engine.abort_step()
        self.collector.resume()
        self.engine.weight_copies.take()  # the aborted pass's count
        self.segment_probe.detach()
        self.recomputer.timing = None
        self.steady_costs.abandon()
        failed = RecomputeFailures.failed_in(error, self.recomputer)
        recorded, self.recomputer.failures = self.recomputer.failures, {}
        self.recomputer.remove()  # the next pass installs its plan's segments again
        self.current = None
        failures = dict(recorded)
        if failed is not None:
            failures[failed.segment] = failed.reason
        last = self.last_entered
        if last is not None:
            model = last.key.model
            excluded = {
                segment
                for segment, reason in failures.items()
                if self.planning.exclude_segment(model, segment, reason)
            }
            if excluded:
                self._remake_plans(
                    lambda key, plan: key.model == model and not excluded.isdisjoint(plan.recomputed)
                )
        return failed

    def retry_out_of_memory(self, error: BaseException | None = None) -> bool:
        """After :meth:`abort`: grow the reserve by an eighth of the budget and re-make every plan,
        unless the pass that failed failed too often in a row: then it raises
        :class:`OutOfMemoryAfterRetriesError` from ``error`` (``False`` without ``error``). A
        profiling pass that failed with ``error`` raises :class:`ProfilingPassOutOfMemoryError`
        from it (``False`` without ``error``): no plan needs less than that pass."""
        failed = self.last_entered
        headroom = self.planning.headroom
        if failed is not None and failed.plan is None and error is not None:
            raise ProfilingPassOutOfMemoryError(headroom.budget_bytes, error) from error
        if failed is None or failed.plan is None:
            return False
        if not self.out_of_memory_retries.take():
            if error is None:
                return False
            raise OutOfMemoryAfterRetriesError(
                headroom.budget_bytes, headroom.reserve_bytes, error
            ) from error
        retry = self.out_of_memory_retries.count
        self.planning.raise_reserve(
            max(1, self.planning.headroom.budget_bytes // 8),
            f"device out of memory in a planned pass (retry {retry} of {MAX_OUT_OF_MEMORY_RETRIES})",
        )
        self._remake_plans(lambda key, plan: True)
        self.plan = self.book.plan(failed.key)
        return True

    def _remake_plans(self, which: Callable[[PassKey, Plan], bool]) -> None:
        """Re-make, from its own profile, every kept plan ``which`` names (the one in force too);
        plans in the making are forgotten (the next pass of their kind refines again)."""
        self.background_plans.drop()
        self._warm_profiles.clear()
        for key in self.book.passes():
            plan = self.book.plan(key)
            if plan is not None and which(key, plan):
                self.book.replan(key, self.make_plan(plan.profile, key))
                if self.plan is plan:
                    self.plan = self.book.plan(key)
