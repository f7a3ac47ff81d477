"""Recomputation of regionally compiled blocks under OffloadSession: each compiled block is a
recompute candidate, recomputed as a whole (its compiled code run again in backward, from its
eager boundary), with gradients bitwise equal to the same compiled model trained without the
session, the plan's choice shown per block, and each block compiled once.

Two plans force recomputation (a model of three alike blocks): policy ``"recompute"`` (keep or
recompute) at the least budget it fits, and policy ``"auto"`` over a host link of about 1 KB/s
a byte below that budget, for the model with a wide layer after its blocks, which only
swapping frees: the plan swaps it and recomputes blocks.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from lightning_accudnn.planner.plan import ROUTE_REGIONAL, Plan, min_budget_bytes
from lightning_accudnn.profile import ROOT_LAYER, LayerChoice, StepProfile
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from lightning_accudnn.testing import SimulatedGPU
from tests.compile.helpers import (
    BACKENDS,
    CLASSES,
    FORMS,
    WIDTH,
    Block,
    CompileCounts,
    Net,
    NormDropoutBlock,
    assert_bitwise_equal,
    backend_param,
    batches,
    compile_blocks,
    count_compiled_calls,
    grads_of,
    loss_of,
    train_plain,
)
from tests.recompute.models import slow_link

STEPS = 3 + TIMED_PLANNED_PASSES  # a profiling pass, the timed planned passes, then two replayed
BLOCKS = tuple(f"blocks.{i}" for i in range(3))
POLICIES = {"recompute": "recompute", "swap and recompute": "auto"}


class WideHeadNet(Net):
    """Three blocks, then a wide layer and the head, outside every block: what they save only
    swapping frees, so at the least budget a plan must swap them beside recomputing blocks."""

    def __init__(self, block: Callable[[], nn.Module] = Block) -> None:
        super().__init__(blocks=len(BLOCKS), block=block)
        self.widen = nn.Linear(WIDTH, 16 * WIDTH)
        self.head = nn.Linear(16 * WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.head(torch.relu(self.widen(x)))


def three_block_net(
    backend: str, form: str, block: Callable[[], nn.Module] = Block, *, wide_head: bool = False
) -> Net:
    torch.manual_seed(0)
    model = WideHeadNet(block) if wide_head else Net(blocks=len(BLOCKS), block=block)
    return compile_blocks(model, backend, form)


def planned_profile(
    backend: str,
    form: str,
    config: OffloadConfig,
    runtime=None,
    block: Callable[[], nn.Module] = Block,
    *,
    wide_head: bool = False,
) -> StepProfile:
    """The profile a session plans from (its segments: the compiled blocks), with room for everything."""
    model = three_block_net(backend, form, block, wide_head=wide_head)
    session = train(model, config.replace(budget=10**9), 2, runtime).session
    assert session.plan is not None
    return session.plan.profile


@dataclass
class Training:
    """What :func:`train` saw, per step: gradients, the runs of each block's compiled code, the
    plan the pass ran under (``None``: the profiling pass), whether it ran hooked (profiled)."""

    session: OffloadSession
    grads: list[list[torch.Tensor]] = field(default_factory=list)
    runs: list[dict[str, int]] = field(default_factory=list)
    plans: list[Plan | None] = field(default_factory=list)
    hooked: list[bool] = field(default_factory=list)


def train(model: Net, config: OffloadConfig, steps: int, runtime=None) -> Training:
    """``steps`` SGD steps of ``model`` under a session made from ``config``."""
    counters = {name: count_compiled_calls(model.get_submodule(name)) for name in BLOCKS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(config, "cpu", runtime=runtime, report=lambda line: None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    training = Training(session)
    attach, attached = session.engine.tracker.attach, []
    session.engine.tracker.attach = lambda model: (attached.append(model), attach(model))[1]
    torch.manual_seed(2)  # dropout's random numbers, as in plain training
    for batch in batches(steps):
        before = {name: counter[0] for name, counter in counters.items()}
        hooked_before = len(attached)
        optimizer.zero_grad()
        with session.step(model, optimizer):
            loss = loss_of(model, batch)
            in_force = session.plan  # the pass's plan (its backward may make the next one)
        loss.backward()
        assert session.stats is not None
        training.plans.append(None if session.stats.profiling else in_force)
        training.hooked.append(len(attached) > hooked_before)
        training.grads.append(grads_of(model))
        training.runs.append({name: counter[0] - before[name] for name, counter in counters.items()})
        optimizer.step()
    session.close()
    return training


def budget_for(profile: StepProfile, policy: str, reserve_bytes: int = 0) -> int:
    """The least budget ``policy`` plans at: below keeping everything, so the plan must recompute."""
    budget = min_budget_bytes(profile, reserve_bytes, policy=policy)
    assert budget < profile.unconstrained_peak_bytes + reserve_bytes
    return budget


def mixed_budget(profile: StepProfile, reserve_bytes: int = 0) -> int:
    """A byte below the least budget at which keeping or recomputing fits: a plan must swap
    (the wide layer's activations) and, over a slow link, recomputes blocks rather than swap them."""
    budget = min_budget_bytes(profile, reserve_bytes, policy="recompute") - 1
    assert budget >= min_budget_bytes(profile, reserve_bytes, policy="auto")
    return budget


def assert_recomputes_blocks(training: Training, swaps: bool) -> None:
    """The plan names each compiled block as a layer and recomputes some of them as wholes
    (swapping as well when ``swaps``); in every pass run under a plan, a recomputed block's
    compiled code ran twice (forward, then again in backward) and every other block's once."""
    plan = training.session.plan
    assert plan is not None and plan.route == ROUTE_REGIONAL
    names = [layer.name for layer in plan.profile.layers]
    # The mixed plans' model (WideHeadNet): its head saves only what its wide layer saved. The
    # models' own code saves after the stem and for the loss (and after WideHeadNet's wide layer).
    after_blocks = ("widen",) if swaps else ("head",)
    modules = {name for name in names if name.split("#", 1)[0] != ROOT_LAYER}
    assert modules == {"stem", *BLOCKS, *after_blocks}, names  # nothing inside a block
    assert names.index("stem") < names.index(ROOT_LAYER) < names.index("blocks.0"), names
    assert {segment.name for segment in plan.profile.segments} == set(BLOCKS)
    assert plan.recomputed and set(plan.recomputed) <= set(BLOCKS), plan.recomputed
    choices = dict(zip(names, plan.choices, strict=True))
    table = str(plan).splitlines()
    for name in plan.recomputed:
        assert choices[name] is LayerChoice.RECOMPUTE
        assert any(line.split()[0] == name and line.endswith("recompute") for line in table if line), table
    assert bool(plan.swapped_layers) == swaps, plan.swapped_layers
    assert training.plans[0] is None and all(training.plans[1:]), training.plans
    for in_force, runs in zip(training.plans[1:], training.runs[1:], strict=True):
        assert in_force is not None and in_force.recomputed == plan.recomputed
        assert runs == {name: 2 if name in plan.recomputed else 1 for name in BLOCKS}, runs
    # Once the plan is made and its pass recorded, passes replay by ordinal (no module hooks).
    assert training.hooked[-2:] == [False, False], training.hooked


#: Every backend and form with the mixed plan; policy recompute (nothing swapped) once per backend.
CASES = [
    *((backend, form, "swap and recompute") for backend in BACKENDS for form in FORMS),
    ("aot_eager", "block.compile()", "recompute"),
    ("inductor", "torch.compile(block)", "recompute"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "form", "plan"), [backend_param(*case) for case in CASES])
def test_recomputed_compiled_blocks_train_bitwise_equal_compiled_once(backend, form, plan, monkeypatch):
    slow_link(monkeypatch)  # auto: copies cost seconds, so it swaps only what recomputing cannot free
    torch._dynamo.reset()
    policy = POLICIES[plan]
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy=policy)
    result = {}

    def run() -> None:
        wide = plan == "swap and recompute"
        profile = planned_profile(backend, form, config, wide_head=wide)
        budget = mixed_budget(profile) if wide else budget_for(profile, policy)
        model = three_block_net(backend, form, wide_head=wide)
        result["session"] = train(model, config.replace(budget=budget), STEPS)
        result["plain"] = train_plain(three_block_net(backend, form, wide_head=wide), STEPS)

    counts = CompileCounts.during(run)

    assert_bitwise_equal(result["plain"], result["session"].grads)
    assert_recomputes_blocks(result["session"], swaps=plan == "swap and recompute")
    # The three blocks are alike: one frame for all, compiled once over the profiling sessions,
    # the recomputing passes (forward and backward) and the plain model.
    assert counts == CompileCounts(frames=1, graphs=1, graph_breaks=0, recompiles=0), counts


@pytest.mark.slow
@pytest.mark.parametrize("lag", [0, None], ids=["lag 0", "unbounded lag"])
def test_swapped_and_recomputed_compiled_blocks_on_a_simulated_gpu(lag, monkeypatch):
    """The mixed plan on a simulated GPU whose allocator is capped at what the budget leaves
    beside the model state: no stream-order violation, no out-of-memory, plain gradients."""
    slow_link(monkeypatch)
    torch._dynamo.reset()
    backend, form = "aot_eager", "block.compile()"
    reserve = 16 * 1024  # the simulated allocator rounds blocks to 512 bytes: the reserve covers it
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=reserve, policy="auto")
    result = {}

    def run() -> None:
        profile = planned_profile(backend, form, config, runtime=SimulatedGPU(lag=lag), wide_head=True)
        budget = mixed_budget(profile, reserve)
        gpu = result["gpu"] = SimulatedGPU(lag=lag, seed=3, capacity_bytes=budget - profile.static_bytes)
        model = three_block_net(backend, form, wide_head=True)
        result["session"] = train(model, config.replace(budget=budget), STEPS, gpu)

    counts = CompileCounts.during(run)
    training, gpu = result["session"], result["gpu"]

    assert_bitwise_equal(train_plain(three_block_net(backend, form, wide_head=True), STEPS), training.grads)
    assert_recomputes_blocks(training, swaps=True)
    assert gpu.violations == [] and gpu.num_ooms == 0
    assert gpu.peak_bytes <= gpu.allocator.capacity_bytes
    assert counts == CompileCounts(frames=1, graphs=1, graph_breaks=0, recompiles=0), counts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "form"),
    [backend_param("aot_eager", "block.compile()"), backend_param("inductor", "torch.compile(block)")],
)
def test_a_recomputed_compiled_block_replays_dropout_and_updates_batch_norm_once(backend, form):
    """Recomputing a compiled block with dropout and BatchNorm: the same random numbers in
    backward (the forward's RNG state is replayed), running statistics updated once per step
    (scratch copies while it is recomputed), and still compiled once."""
    torch._dynamo.reset()
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="recompute")
    result = {}

    def run() -> None:
        model = three_block_net(backend, form, NormDropoutBlock)
        budget = budget_for(planned_profile(backend, form, config, block=NormDropoutBlock), "recompute")
        result["session"] = (train(model, config.replace(budget=budget), STEPS), model.state_dict())
        plain = three_block_net(backend, form, NormDropoutBlock)
        torch.manual_seed(2)
        result["plain"] = (train_plain(plain, STEPS), plain.state_dict())

    counts = CompileCounts.during(run)
    (training, state), (expected, plain_state) = result["session"], result["plain"]

    assert_bitwise_equal(expected, training.grads)
    assert_recomputes_blocks(training, swaps=False)
    assert state.keys() == plain_state.keys() and any("running_mean" in name for name in state)
    for name, value in plain_state.items():
        assert torch.equal(state[name], value), f"{name} differs"
    assert counts == CompileCounts(frames=1, graphs=1, graph_breaks=0, recompiles=0), counts
