"""Plans that refine a pass kind's plan are made on a worker thread while training goes on: the
kind runs the plan in force until the refined one is ready, errors surface before a forward,
and nothing of the worker outlives the session."""

import threading

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner import plan_swaps
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session import planning
from lightning_accudnn.session.background_plans import THREAD_NAME, BackgroundPlans
from lightning_accudnn.session.coordination import RankCoordinator
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from tests.session.helpers import seeded_steps

WORKER = THREAD_NAME


def _profile() -> StepProfile:
    return StepProfile((LayerProfile("fc", 4_000, 4_000, 1e-3, 2e-3),), static_bytes=1_000)


def _workers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(WORKER)]


def test_a_plan_is_taken_once_ready_and_only_under_what_it_was_made_under():
    gate = threading.Event()
    plans = BackgroundPlans()

    def make():
        gate.wait()
        return plan_swaps(_profile(), 10_000)

    plans.submit("kind", make, made_under="headroom")
    assert plans.take("kind", made_under="headroom") is None and plans.waiting("kind")  # in the making
    gate.set()
    plans.wait_all()
    ready = plans.take("kind", made_under="headroom")
    assert ready is not None and ready.seconds > 0 and not plans.waiting("kind")
    plans.submit("kind", lambda: plan_swaps(_profile(), 10_000), made_under="headroom")
    plans.wait_all()
    assert plans.take("kind", made_under="a larger reserve") is None and not plans.waiting("kind")
    plans.close()
    assert not _workers()


def test_the_workers_error_is_raised_by_take():
    plans = BackgroundPlans()

    def fail():
        raise RuntimeError("no plan")

    plans.submit("kind", fail, made_under=None)
    plans.wait_all()
    with pytest.raises(RuntimeError, match="no plan"):
        plans.take("kind", made_under=None)
    assert not plans.waiting("kind")
    plans.close()


class Gate:
    """``plan_swaps`` as the session's planning calls it, held on the worker until opened."""

    def __init__(self, monkeypatch, error: Exception | None = None) -> None:
        self.opened = threading.Event()
        self.worker_calls = 0
        self.error = error

        def gated(*args, **kwargs):
            if threading.current_thread().name.startswith(WORKER):
                self.worker_calls += 1
                self.opened.wait()
                if self.error is not None:
                    raise self.error
            return plan_swaps(*args, **kwargs)

        monkeypatch.setattr(planning, "plan_swaps", gated)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def _session(**options) -> OffloadSession:
    return OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0, **options), "cpu")


def _after_the_timed_passes(**options):
    """A session (of ``options``), its model and optimizer, trained through the profiling pass
    and the timed planned passes: the refined plan is in the making."""
    session, model = _session(**options), _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seeded_steps(session, model, optimizer, 1 + TIMED_PLANNED_PASSES)
    return session, model, optimizer


def test_training_goes_on_under_the_plan_in_force_until_the_refined_plan_is_ready(monkeypatch):
    gate = Gate(monkeypatch)
    session, model, optimizer = _after_the_timed_passes()
    timed = 1 + TIMED_PLANNED_PASSES
    first = session.plan
    waiting = seeded_steps(session, model, optimizer, 3, first=timed)
    assert gate.worker_calls == 1  # one plan in the making, from every timed pass
    assert [s.plan_source.value for s in waiting] == ["profiled"] * 3 and session.plan is first
    assert all(s.planning_seconds == 0.0 for s in waiting)
    gate.opened.set()
    session.wait_for_plans()
    assert session.plan is not first
    (adopting,) = seeded_steps(session, model, optimizer, 1, first=timed + 3)
    assert adopting.plan_source.value == "refined" and adopting.background_planning_seconds > 0
    assert gate.worker_calls == 1  # settled: no more plans
    session.close()


def test_the_same_gradients_whichever_plan_a_pass_runs(monkeypatch):
    """A pass kind waiting for its refined plan trains exactly as plain training does."""
    Gate(monkeypatch).opened.set()
    session, model = _session(), _model()
    reference = _model()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (model, reference)]
    for step in range(4 + TIMED_PLANNED_PASSES):
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step))
        with session.step(model, optimizers[0]):
            loss = model(x).square().mean()
        loss.backward()
        reference(x).square().mean().backward()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), step
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    session.close()


def test_an_error_making_the_plan_is_raised_where_it_would_be_adopted_and_training_goes_on(monkeypatch):
    gate = Gate(monkeypatch, error=RuntimeError("the planner failed"))
    gate.opened.set()
    session, model, optimizer = _after_the_timed_passes()
    with pytest.raises(RuntimeError, match="the planner failed"):
        session.wait_for_plans()
    gate.error = None
    (retimed,) = seeded_steps(session, model, optimizer, 1, first=10)  # the plan in force, timed again
    assert retimed.plan_source.value == "profiled"
    session.wait_for_plans()
    assert gate.worker_calls == 2  # planned from the pass timed again
    (adopting,) = seeded_steps(session, model, optimizer, 1, first=11)
    assert adopting.plan_source.value == "refined"
    session.close()


def test_a_plan_in_the_making_when_the_reserve_grows_is_never_adopted(monkeypatch):
    gate = Gate(monkeypatch)
    session, model, optimizer = _after_the_timed_passes()
    in_the_making = gate.worker_calls
    assert session.recover_from_out_of_memory()  # as after a planned pass ran out of memory
    gate.opened.set()
    session.wait_for_plans()
    (retimed,) = seeded_steps(session, model, optimizer, 1, first=9)
    assert retimed.plan_source.value == "profiled"  # not the plan made before the reserve grew
    session.wait_for_plans()
    assert in_the_making == 1 and gate.worker_calls == 2  # timed again, and planned from
    session.close()


def test_close_waits_for_the_plan_in_the_making_and_leaves_no_worker(monkeypatch):
    gate = Gate(monkeypatch)
    session, model, optimizer = _after_the_timed_passes()
    assert _workers()
    threading.Timer(0.05, gate.opened.set).start()
    session.close()
    assert not _workers()


def test_inline_planning_makes_no_worker(monkeypatch):
    gate = Gate(monkeypatch)
    session, model = _session(plan_in_background=False), _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stats = seeded_steps(session, model, optimizer, 2 + TIMED_PLANNED_PASSES)
    assert gate.worker_calls == 0 and not _workers()
    assert stats[-1].plan_source.value == "refined"
    session.close()


def test_an_agreement_leaves_in_the_background_only_what_every_rank_asks_to_refine():
    from lightning_accudnn.session.agreement import Measured, PlanAgreement
    from lightning_accudnn.session.coordination import ReplanRequest
    from lightning_accudnn.session.plan_book import PassKey

    refine, other, grown = (PassKey(model=m, batch=(), position=0) for m in (1, 2, 3))
    agreement = PlanAgreement(RankCoordinator())
    for key in (refine, other, grown):
        agreement.record(
            key, Measured(_profile(), None, planned=True), ReplanRequest(replan=True, refine_only=True)
        )
    agreement.record(
        other, Measured(_profile(), None, planned=True), ReplanRequest(replan=True)
    )  # graph changed
    agreed = agreement.agree()
    assert agreed.refine_only == {refine, grown}
    agreement.record(
        refine, Measured(_profile(), None, planned=True), ReplanRequest(replan=True, refine_only=True)
    )
    agreement.record(grown, Measured(_profile(), None, planned=True), agreement.overshoot(1_000))
    agreed = agreement.agree()
    assert set(agreed.profiles) == {refine, grown} and agreed.refine_only == frozenset()


class SharedEvery(RankCoordinator):
    """A coordinator whose agreed plans other ranks run too, agreeing after every ``every``-th pass
    (one process: what it agrees is this rank's own)."""

    def __init__(self, every: int) -> None:
        self.every, self.passes = every, 0

    @property
    def shared(self) -> bool:
        return True

    def due(self) -> bool:
        self.passes += 1
        return self.passes % self.every == 0


def test_ranks_run_each_agreed_plan_from_the_pass_after_the_agreement(monkeypatch):
    """A plan made on a thread is adopted by the first pass after it is ready, a pass of each rank's
    own: where other ranks run the plans agreed, an agreement makes them at once."""
    gate = Gate(monkeypatch)  # never opened: a plan made on the worker is never ready
    every = 3
    session = OffloadSession(
        OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu", coordinator=SharedEvery(every)
    )
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stats, plans = [], []
    for step in range(4 * every):
        stats += seeded_steps(session, model, optimizer, 1, first=step)
        plans.append(session.plan)
    agreements = [step for step in range(len(plans)) if step % every == every - 1]
    changed = [step for step in range(1, len(plans)) if plans[step] is not plans[step - 1]]
    assert gate.worker_calls == 0
    assert set(changed) <= set(agreements) and len(changed) >= 2  # the first plan refined, and again
    assert all(stats[step].planning_seconds > 0 for step in changed)
    session.close()
