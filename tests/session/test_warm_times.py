"""The first planned passes of a kind are timed again, and the plan keeps each layer's fastest
time: passes that run cold (a first pass allocates, chooses kernels, loads libraries) do not set
the times the steady state is planned from."""

import time

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.session.steady_costs import STEADY_TIMED_PASSES
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from tests.session.helpers import seeded_steps

COLD_SECONDS = 0.05


class ColdFirst(nn.Module):
    """A layer whose first ``cold`` calls take :data:`COLD_SECONDS` longer, as a cold pass does."""

    def __init__(self, cold: int) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 64)
        self.calls, self.cold = 0, cold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= self.cold:
            time.sleep(COLD_SECONDS)
        return torch.relu(self.linear(x))


def _train(session: OffloadSession, model: nn.Module, steps: int) -> list[tuple[str, bool]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hooked: list[bool] = []
    offload = session.engine.offload

    def spy(*args, sequence=None, **kwargs):
        hooked.append(sequence is None)
        return offload(*args, sequence=sequence, **kwargs)

    session.engine.offload = spy
    sources = [stats.plan_source.value for stats in seeded_steps(session, model, optimizer, steps)]
    return list(zip(sources, hooked, strict=True))


def _model(cold: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(ColdFirst(cold), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def test_the_first_planned_passes_are_timed_then_the_plan_settles():
    config = OffloadConfig(budget="1GB", min_swap_bytes=0, plan_in_background=False)
    session = OffloadSession(config, "cpu")
    passes = _train(session, _model(cold=0), steps=3 + TIMED_PLANNED_PASSES)
    assert passes == [
        ("profiling", True),
        ("profiled", True),
        *[("refined", True)] * (TIMED_PLANNED_PASSES - 1),
        ("refined", False),
        ("refined", False),
    ]
    session.close()


def test_in_background_the_same_passes_are_timed_under_the_first_plan_then_the_refined_one_is_adopted():
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    model = _model(cold=0)
    timed = _train(session, model, steps=1 + TIMED_PLANNED_PASSES)
    assert timed == [("profiling", True), *[("profiled", True)] * TIMED_PLANNED_PASSES]
    assert session.stats.background_planning_seconds == 0.0
    session.wait_for_plans()
    assert _train(session, model, steps=1) == [("refined", False)]
    assert session.stats.background_planning_seconds > 0.0  # the worker's time making it
    assert _train(session, model, steps=1) == [("refined", False)]
    assert session.stats.background_planning_seconds == 0.0  # only the pass that adopted it
    session.close()


@pytest.mark.parametrize("in_background", [False, True])
def test_a_layer_keeps_the_time_of_its_warm_passes(in_background):
    config = OffloadConfig(budget="1GB", min_swap_bytes=0, plan_in_background=in_background)
    session = OffloadSession(config, "cpu")
    model = _model(cold=2)  # the profiling pass and the first planned pass run cold
    _train(session, model, steps=2 + TIMED_PLANNED_PASSES)
    session.wait_for_plans()
    _train(session, model, steps=1)
    assert session.plan.profile is not None
    (cold_layer,) = (layer for layer in session.plan.profile.layers if layer.name == "0")
    assert cold_layer.forward_seconds < COLD_SECONDS / 2
    session.close()


def test_in_background_a_layer_keeps_its_fastest_time_over_every_timed_pass():
    """The first timed planned pass runs warm and the second cold: the plan made after the
    second still keeps the first's time (the passes timed while the plan waits are all kept)."""
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    model = _model(cold=1)  # the profiling pass runs cold
    _train(session, model, steps=2)
    model[0].calls, model[0].cold = 0, 1  # the next (last timed) pass runs cold again
    _train(session, model, steps=TIMED_PLANNED_PASSES - 1)
    session.wait_for_plans()
    _train(session, model, steps=1)
    assert session.stats.plan_source.value == "refined"
    (cold_layer,) = (layer for layer in session.plan.profile.layers if layer.name == "0")
    assert cold_layer.forward_seconds < COLD_SECONDS / 2
    session.close()


class SlowWhenHooked(nn.Module):
    """A layer taking :data:`COLD_SECONDS` longer while the engine's module hooks are on it (a
    pass timed layer by layer), as a forward the host issues takes on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._forward_pre_hooks:
            time.sleep(COLD_SECONDS)
        return torch.relu(self.linear(x))


def test_the_plan_charges_the_forward_the_passes_replayed_under_it_took():
    """Every hooked pass times the first layer :data:`COLD_SECONDS` slower than it runs: the
    plan made from them predicts that; the passes replayed under it time the forward whole, and
    the plan is made again from the fastest of them."""
    config = OffloadConfig(budget="1GB", min_swap_bytes=0, plan_in_background=False)
    session = OffloadSession(config, "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(SlowWhenHooked(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    passes = _train(session, model, steps=2 + TIMED_PLANNED_PASSES + STEADY_TIMED_PASSES + 2)
    refined = 1 + TIMED_PLANNED_PASSES
    hooked_plan = passes[: refined + 1]
    assert [hooked for _, hooked in hooked_plan] == [True] * refined + [False]
    plan = session.plan
    forward = sum(layer.forward_seconds for layer in plan.profile.layers)
    assert forward < COLD_SECONDS / 2, forward  # made again from the replayed passes
    assert plan.predicted_step_seconds < COLD_SECONDS
    assert not session.stats.steady_timing and not session.stats.timed
    session.close()


class _SlowBackwardWhenUnhooked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, hooked):  # type: ignore[no-untyped-def]
        ctx.hooked = hooked
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        if not ctx.hooked:
            time.sleep(COLD_SECONDS)
        return grad, None


class SlowBackwardWhenUnhooked(nn.Module):
    """A layer whose backward takes :data:`COLD_SECONDS` longer after a forward the engine's
    module hooks were not on: the steady state's backward is slower than a hooked pass times."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hooked = bool(self._forward_pre_hooks)
        return torch.relu(_SlowBackwardWhenUnhooked.apply(self.linear(x), hooked))


def test_the_plan_charges_the_backward_the_passes_replayed_under_it_took():
    config = OffloadConfig(budget="1GB", min_swap_bytes=0, plan_in_background=False)
    session = OffloadSession(config, "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(SlowBackwardWhenUnhooked(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    _train(session, model, steps=2 + TIMED_PLANNED_PASSES + STEADY_TIMED_PASSES + 2)
    plan = session.plan
    backward = sum(layer.backward_seconds for layer in plan.profile.layers)
    assert backward >= COLD_SECONDS, backward  # made again from the replayed passes' backward
    assert plan.predicted_step_seconds >= COLD_SECONDS
    assert not session.stats.steady_timing and not session.stats.timed
    session.close()
