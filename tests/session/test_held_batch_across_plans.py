"""A storage the model's code holds beyond the forward (the batch) stays kept under every plan.

The profiling pass swaps everything and finds the batch alive when its forward ends: swapping it
freed nothing, so the plans made from that pass keep it. A pass under a plan that keeps it cannot
find that again (it never lets it go). Its profile must still report the batch not swappable,
whatever the plan recomputes, or the next plan swaps it, frees nothing and peaks above its
prediction. Here the first plan recomputes two blocks and the later ones swap: the profile of
every plan reports the batch as held, and no pass peaks above its prediction (the reserve is never
raised). CPU: the allocator is the ops' own tensors.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.session import planning as planning_module
from tests.session.helpers import run_counted

WIDTH, BATCH, STEPS = 64, 512, 6
BUDGET = 3_000_000  # this model's step needs about 3.06 MB unconstrained, 0.83 MB of it model state


def _model() -> nn.Module:
    torch.manual_seed(0)

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.Tanh(), nn.Linear(4 * WIDTH, WIDTH), nn.Tanh())

    return nn.Sequential(nn.Linear(WIDTH, WIDTH), block(), block(), block(), nn.Linear(WIDTH, 1))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(step))


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).square().mean()


def test_the_batch_stays_held_when_the_recomputed_segments_change(monkeypatch: pytest.MonkeyPatch) -> None:
    real = planning_module.plan_swaps
    made: list[Plan] = []

    def first_recomputes(profile: StepProfile, *args: object, **kwargs: object) -> Plan:
        # Keep or recompute first (the pass under it saves other tensors in another order), then
        # keep or swap.
        kwargs["policy"] = "swap" if made else "recompute"
        plan = real(profile, *args, **kwargs)  # type: ignore[arg-type]
        made.append(plan)
        return plan

    monkeypatch.setattr(planning_module, "plan_swaps", first_recomputes)
    seen, _ = run_counted(
        _model(), _batch, _loss, STEPS, budget=BUDGET, reserve_bytes=0, min_swap_bytes=0, policy="auto"
    )
    assert made[0].recomputed and len(made) > 1 and not any(plan.recomputed for plan in made[1:]), made
    batch_bytes = BATCH * WIDTH * 4
    for plan in made:
        first = plan.profile.layers[0]
        assert (first.name, first.saved_bytes, first.swappable_bytes) == ("0", batch_bytes, 0), plan
        assert "0" not in plan.swapped_layers
    planned = [step for step in seen if step.predicted is not None]
    assert len(planned) == STEPS - 1
    for step in planned:
        assert step.peak <= step.predicted and step.reserve == 0, planned


def test_a_batch_shape_planned_from_another_keeps_the_batch_held() -> None:
    """A batch shape planned from another shape's profile never profiles: its passes keep the
    batch from the first, and so do the plans made from them."""
    sizes = [BATCH, BATCH, BATCH, BATCH // 2, BATCH // 2, BATCH // 2, BATCH // 2]

    def batch(step: int) -> torch.Tensor:
        return torch.randn(sizes[step], WIDTH, generator=torch.Generator().manual_seed(step))

    seen, _ = run_counted(
        _model(), batch, _loss, len(sizes), budget=BUDGET, reserve_bytes=0, min_swap_bytes=0, policy="auto"
    )
    for step in seen:
        first = step.profile.layers[0]
        assert (first.name, first.swappable_bytes) == ("0", 0), step
        assert step.predicted is None or (step.peak <= step.predicted and step.reserve == 0), seen
