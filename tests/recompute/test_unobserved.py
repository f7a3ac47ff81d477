"""Steady state under a plan that recomputes and swaps nothing: passes run without the engine's
hooks but one in ``observe_every`` of each kind, recompute their segments (BatchNorm's running
statistics updated once, dropout replayed) and train bitwise like the plain loop."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.ops.recompute import is_recomputing
from lightning_accudnn.planner import plan as planner_plan
from lightning_accudnn.testing import SimulatedGPU
from tests.recompute.models import batch, build, forcing_search, loss_of

EVERY = 4
STEPS = 16


def _train_both(session, trained, reference, kind, step):
    """Step ``step`` of ``trained`` (model, optimizer) under ``session`` and of ``reference``
    plainly, dropout seeded alike: their gradients bitwise equal before the optimizers step."""
    (model, optimizer), (plain, plain_optimizer) = trained, reference
    inputs, targets = batch(kind, step)
    torch.manual_seed(step)
    with session.step(model, optimizer):
        loss = loss_of(model, inputs, targets)
    loss.backward()
    torch.manual_seed(step)
    loss_of(plain, inputs, targets).backward()
    for (name, a), b in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), (step, name)
    for opt in (optimizer, plain_optimizer):
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(
    ("kind", "names"), [("resnet", ("blocks.0", "blocks.2")), ("gpt", ("blocks.0", "blocks.1.mlp"))]
)
def test_recomputing_plans_that_swap_nothing_run_mostly_unobserved_and_train_bitwise(
    kind, names, monkeypatch
):
    monkeypatch.setattr(planner_plan, "search_mixed", forcing_search(names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = OffloadConfig(
            budget=10**10, min_swap_bytes=0, reserve_bytes=0, policy="recompute", observe_every=EVERY
        )
        session = OffloadSession(config, "cpu")
    model = build(kind)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    recomputations = []
    inner = next(model.get_submodule(names[0]).children())  # its hooks run again when recomputed
    inner.register_forward_hook(lambda *_: recomputations.append(1) if is_recomputing() else None)
    observed = []
    for step in range(STEPS):
        before = len(recomputations)
        _train_both(session, (model, optimizer), (reference, reference_optimizer), kind, step)
        assert session.stats is not None
        if not session.stats.profiling:
            plan = session.plan
            assert plan is not None and sorted(plan.recomputed) == sorted(names), plan
            assert not plan.swapped_layers
            assert len(recomputations) > before, step  # the segment ran again in backward
            observed.append(session.stats.observed)
    session.close()
    steady = observed[4:]
    assert steady.count(False) >= len(steady) // 2, observed  # most steady passes skip the hooks
    runs = longest = 0
    for seen in observed:
        runs = 0 if seen else runs + 1
        longest = max(longest, runs)
    assert longest <= EVERY - 1, observed
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("swapped", [("stem.1",), ("blocks.1.bn1", "blocks.1.relu")])
@pytest.mark.parametrize("lag", ["cpu", 0, 3, None])
def test_plans_that_recompute_and_swap_drop_the_hooks_after_their_last_swap_and_train_bitwise(
    swapped, lag, monkeypatch
):
    """A plan recomputing whole segments and swapping other layers (before the first recomputed
    segment, or between two): its unobserved passes swap, recompute and take the hooks out after
    the last swapped save, the segments after it recomputed with no hook of the engine's; on the
    CPU and on a simulated GPU at every lag, copies in order and training bitwise plain."""
    names = ("blocks.0", "blocks.2")
    monkeypatch.setattr(planner_plan, "search_mixed", forcing_search(names, swapped))
    gpu = None if lag == "cpu" else SimulatedGPU(lag=lag, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = OffloadConfig(
            budget=10**10, min_swap_bytes=0, reserve_bytes=0, policy="recompute", observe_every=EVERY
        )
        session = OffloadSession(config, "cpu", runtime=gpu)
    model = build("resnet")
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    steady = []
    for step in range(STEPS):
        _train_both(session, (model, optimizer), (reference, reference_optimizer), "resnet", step)
        stats = session.stats
        assert stats is not None
        if not stats.profiling:
            plan = session.plan
            assert plan is not None and sorted(plan.recomputed) == sorted(names), plan
            assert plan.swapped_layers == frozenset(swapped), plan.swapped_layers
            assert stats.bytes_swapped_out > 0, step
            steady.append(stats.observed)
    session.close()
    assert steady[4:].count(False) >= len(steady[4:]) // 2, steady  # most passes drop the hooks
    assert gpu is None or gpu.violations == []
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
