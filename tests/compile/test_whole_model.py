"""The experimental whole-model route, switched on by ``whole_model_compile="experimental"``
(CPU, PyTorch 2.14.1): the session plans a model compiled whole from its trial partition with
the project's planner and budget, tags exactly the plan's choices in the partitioner, trains
with eager gradients, compiles again only for a changed plan; what it cannot serve is refused
when the config is made."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache
from torch.profiler import ProfilerActivity, profile

from lightning_accudnn.planner import BudgetTooSmallError
from lightning_accudnn.planner.plan import ROUTE_WHOLE_MODEL, plan_swaps
from lightning_accudnn.profile import ROOT_LAYER, LayerChoice
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.patterns import UnmatchedPatternError
from lightning_accudnn.whole_model_compile import TRIAL_PLAN, PlanBackend, PlanPartitioner, plan_choices
from lightning_accudnn.whole_model_compile.route import WholeModelRoute
from tests.compile.helpers import (
    CompileCounts,
    Net,
    assert_bitwise_equal,
    backend_param,
    batches,
    grads_of,
    loss_of,
    sgd,
    train_in,
    train_plain,
)

STEPS = 3
ROUTE = {"whole_model_compile": "experimental", "whole_model_backend": "aot_eager", "min_swap_bytes": 0}
FORMS = ("torch.compile(model)", "model.compile()")


@pytest.fixture(autouse=True)
def dynamo_reset():
    """Dynamo keeps a graph per plan backend on ``Net.forward``'s code, shared by every test."""
    torch._dynamo.reset()


def _net(blocks: int = 2) -> Net:
    torch.manual_seed(0)
    return Net(blocks)


def _compiled(model: Net, form: str) -> torch.nn.Module:
    """``model`` compiled whole in ``form`` (with the eager backend: the route compiles it anew)."""
    if form == "torch.compile(model)":
        return torch.compile(model, backend="eager")
    model.compile(backend="eager")
    return model


def _trial_profile(blocks: int = 2):
    """The profile a session plans ``Net(blocks)`` from (its trial partition, its model state)."""
    model = _net(blocks)
    route = WholeModelRoute("aot_eager", accelerator=False)
    with route.compiled():
        loss = loss_of(torch.compile(model, backend="eager"), batches(1)[0])
    loss.backward()
    return route.trial_profile(model_state_bytes(model, [sgd(model)]), min_swap_bytes=0)


@pytest.fixture(scope="module")
def tight_budget() -> int:
    """A quarter of the way from the smallest budget that works to keeping everything: a plan
    under it swaps some layers and keeps others."""
    profile = _trial_profile()
    smallest = plan_swaps(profile, profile.unconstrained_peak_bytes).min_budget_bytes
    return smallest + (profile.unconstrained_peak_bytes - smallest) // 4


@pytest.fixture(scope="module")
def eager_grads() -> list[list[torch.Tensor]]:
    return train_plain(_net(), STEPS)


@pytest.mark.parametrize("form", FORMS)
def test_the_session_tags_the_plans_choices_and_trains_with_eager_gradients(form, tight_budget, eager_grads):
    model = _net()
    called = _compiled(model, form)
    session = OffloadSession(OffloadConfig(budget=tight_budget, **ROUTE), "cpu", report=lambda line: None)
    grads = train_in(session, model, STEPS, called)

    plan = session.plan
    assert plan is not None and plan.route == ROUTE_WHOLE_MODEL
    assert f"route: {ROUTE_WHOLE_MODEL}" in str(plan)
    swapped = {layer for layer, choice in plan_choices(plan).items() if choice is LayerChoice.SWAP}
    kept = {layer for layer, choice in plan_choices(plan).items() if choice is LayerChoice.KEEP}
    assert swapped and kept, plan  # the budget makes the plan choose
    route = session.whole_model_route(called)
    assert route is not None and route.planned
    (trial,) = route.trial.partitioner.partitions
    # The trial offloaded every activation it could (the safest mode), and recorded them per layer.
    assert set(trial.offloaded) == {ROOT_LAYER} and not trial.recomputed
    assert swapped <= set(trial.saved_offloaded), (swapped, trial.saved_offloaded)
    (partition,) = route.partitions()  # one graph, compiled once for the plan over all steps
    assert set(partition.offloaded) == swapped and partition.recomputed == {}
    # PyTorch's offload pass took saved activations of swapped layers, and of those only.
    assert partition.saved_offloaded and set(partition.saved_offloaded) <= swapped, partition.saved_offloaded
    assert_bitwise_equal(eager_grads, grads)
    session.close()


def test_a_budget_too_small_is_refused_after_the_first_forward_before_any_weight_changes():
    model = _net()
    called = _compiled(model, "model.compile()")
    before = [p.detach().clone() for p in model.parameters()]
    profile = _trial_profile()
    smallest = plan_swaps(profile, profile.unconstrained_peak_bytes).min_budget_bytes
    session = OffloadSession(OffloadConfig(budget=smallest - 1, **ROUTE), "cpu", report=lambda line: None)
    optimizer = sgd(model)
    with pytest.raises(BudgetTooSmallError) as raised, session.step(called, optimizer):
        loss_of(called, batches(1)[0])
    assert raised.value.min_budget_bytes == smallest
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())  # not even a backward ran
    # The budget the error names works.
    session = OffloadSession(OffloadConfig(budget=smallest, **ROUTE), "cpu", report=lambda line: None)
    with session.step(called, optimizer):
        loss = loss_of(called, batches(1)[0])
    loss.backward()
    assert session.plan is not None and session.plan.predicted_peak_bytes <= smallest


def test_keep_on_device_names_modules_of_the_compiled_graph():
    budget = _trial_profile().unconstrained_peak_bytes - 1  # something must swap
    model = _net()
    called = _compiled(model, "model.compile()")
    config = OffloadConfig(budget=budget, keep_on_device=["blocks.0"], **ROUTE)
    session = OffloadSession(config, "cpu", report=lambda line: None)
    train_in(session, model, STEPS, called)
    swapped = session.plan.swapped_layers
    assert swapped and not any(layer.startswith("blocks.0") for layer in swapped), swapped
    (partition,) = session.whole_model_route(called).partitions()
    assert set(partition.offloaded) == set(swapped)
    # A pattern naming no module of the graph is refused after the first forward, before backward.
    model.zero_grad(set_to_none=True)
    config = OffloadConfig(budget=budget, keep_on_device=["block.0"], **ROUTE)
    session = OffloadSession(config, "cpu", report=lambda line: None)
    with pytest.raises(UnmatchedPatternError, match="'block.0' names no module"), session.step(called):
        loss_of(called, batches(1)[0])
    assert all(p.grad is None for p in model.parameters())


def test_a_first_pass_that_compiled_no_training_graph_is_refused_saying_why():
    called = _compiled(_net(), "torch.compile(model)")
    session = OffloadSession(OffloadConfig(budget=10**9, **ROUTE), "cpu", report=lambda line: None)
    refused = pytest.raises(RuntimeError, match="compiled no training graph")
    with refused, session.step(called), torch.no_grad():
        called(batches(1)[0][0])


class _ConfigSeen(PlanPartitioner):
    """Records the compile settings in force when it partitions."""

    def __call__(self, gm, joint_inputs, **kwargs):
        self.caches_off = torch.compiler.config.force_disable_caches
        self.offloading = torch._functorch.config.enable_activation_offloading
        return super().__call__(gm, joint_inputs, **kwargs)


@pytest.mark.parametrize(("cached", "plan"), [(False, TRIAL_PLAN), (True, {})], ids=["trial", "keep"])
def test_a_plan_backend_partitions_with_the_offload_pass_on_when_it_swaps_and_the_trial_bypasses_caches(
    cached, plan
):
    partitioner = _ConfigSeen(plan)
    backend = PlanBackend(partitioner, "aot_eager", cached=cached)
    loss_of(torch.compile(_net(), backend=backend), batches(1)[0]).backward()
    assert (partitioner.caches_off, partitioner.offloading) == (not cached, bool(plan))
    assert not torch.compiler.config.force_disable_caches  # set only while compiling


def _runtime_copies(model: torch.nn.Module, route: WholeModelRoute) -> int:
    """How many host copies (``prims.device_put``, the CPU form of the offload pass) one
    already-compiled training step runs."""
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        with route.compiled():
            loss = loss_of(model, batches(1)[0])
        loss.backward()
    return sum(event.name == "prims::device_put" for event in recorded.events())


def test_a_changed_plan_compiles_again_and_a_plan_seen_before_reuses_its_graph(tight_budget, eager_grads):
    profile = _trial_profile()
    keep, swap = plan_swaps(profile, profile.unconstrained_peak_bytes), plan_swaps(profile, tight_budget)
    assert not keep.swapped_layers and swap.swapped_layers
    model = _net()
    called = _compiled(model, "torch.compile(model)")
    route = WholeModelRoute("aot_eager", accelerator=False)
    seen = []
    for plan in (keep, swap, keep):
        route.apply(plan)
        model.zero_grad(set_to_none=True)

        def step():
            with route.compiled():
                loss = loss_of(called, batches(1)[0])
            loss.backward()

        frames = CompileCounts.during(step).frames
        assert_bitwise_equal(eager_grads[:1], [grads_of(model)])
        seen.append((frames, len(route.partitions()), _runtime_copies(called, route)))
    (
        (keep_frames, keep_calls, keep_copies),
        (swap_frames, _, swap_copies),
        (again_frames, again_calls, again_copies),
    ) = seen
    assert (keep_frames, swap_frames, again_frames) == (1, 1, 0), seen  # the keep plan's graph is reused
    assert again_calls == keep_calls == 1, seen  # the partitioner did not run again for it
    assert keep_copies == again_copies == 0 < swap_copies, seen  # each step ran its own plan


@pytest.mark.slow
@pytest.mark.parametrize("compiler", [backend_param("inductor")])
def test_inductors_caches_are_keyed_by_the_plan(compiler):
    """Plans A, B, A on Inductor: miss, miss, hit (A's graph comes from the cache in a new
    session's route, without running the partitioner), each with eager gradients. One block:
    fewer kernels to build."""
    profile = _trial_profile(blocks=1)
    plan_a = plan_swaps(profile, profile.unconstrained_peak_bytes)
    plan_b = plan_swaps(profile, profile.unconstrained_peak_bytes - 1)
    assert not plan_a.swapped_layers and plan_b.swapped_layers
    eager_grads = train_plain(_net(blocks=1), 1)
    model = _net(blocks=1)
    called = _compiled(model, "torch.compile(model)")
    first = WholeModelRoute(compiler, accelerator=False)
    seen = []
    with fresh_cache():
        for route, plan in (
            (first, plan_a),
            (first, plan_b),
            (WholeModelRoute(compiler, accelerator=False), plan_a),
        ):
            route.apply(plan)
            counters.clear()
            model.zero_grad(set_to_none=True)
            with route.compiled():
                loss = loss_of(called, batches(1)[0])
            loss.backward()
            hits, misses = (
                counters["aot_autograd"][kind] for kind in ("autograd_cache_hit", "autograd_cache_miss")
            )
            seen.append(("hit" if hits and not misses else "miss", len(route.partitions())))
            for want, got in zip(eager_grads[0], grads_of(model), strict=True):
                torch.testing.assert_close(
                    got, want, rtol=1e-5, atol=1e-6
                )  # Inductor's kernels round otherwise
    assert seen == [("miss", 1), ("miss", 1), ("hit", 0)], seen
    (partition,) = first.partitions()
    assert set(partition.offloaded) == set(plan_b.swapped_layers)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"whole_model_compile": "on"}, ValueError, "must be None or 'experimental'"),
        ({"whole_model_backend": "cudagraphs"}, ValueError, "one of inductor, aot_eager"),
        ({"policy": "recompute"}, ValueError, "use policy 'swap' or 'auto'"),
    ],
    ids=["value", "backend", "policy"],
)
def test_what_the_route_cannot_serve_is_refused_when_the_config_is_made(options, error, match):
    with pytest.raises(error, match=match):
        OffloadConfig(**(ROUTE | options))


def test_a_backend_without_the_option_is_refused():
    with pytest.raises(ValueError, match="used only with whole_model_compile='experimental'"):
        OffloadConfig(whole_model_backend="aot_eager")


def test_an_untested_torch_version_is_refused(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.15.0")
    with pytest.raises(RuntimeError, match=r"tested with PyTorch 2\.14\.1 only.*this is PyTorch 2\.15\.0"):
        OffloadConfig(**ROUTE)


def test_past_dynamos_recompile_limit_the_route_raises_rather_than_run_without_its_plan():
    called = _compiled(_net(), "model.compile()")
    route = WholeModelRoute("aot_eager", accelerator=False)
    with torch._dynamo.config.patch(recompile_limit=1):
        with route.compiled():
            loss_of(called, batches(1)[0])  # the trial: the frame's one graph
        profile = route.trial_profile(static_bytes=0, min_swap_bytes=0)
        route.apply(plan_swaps(profile, profile.unconstrained_peak_bytes - 1))
        with pytest.raises(RuntimeError, match="reached its recompile limit"), route.compiled():
            loss_of(called, batches(1)[0])
