"""Planning one profile after another gives each the plan it gets alone: nothing the planner keeps
from the first profile (memos, caches) reaches the second, neither when only the timings differ
(a refinement's profile) nor when the bytes do.

Each profile's own plans are made with every answer computed afresh (the planner's memo,
:class:`~lightning_accudnn.planner.recompute.LastProfileMemo`, bypassed); then, with the memo on,
the first profile, a copy of the second (another object, as each pass's profile is) and a copy
of the first again must get exactly those plans. The two profiles are chosen so that their plans
differ, so that an answer carried over would show."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_accudnn.planner.plan import BudgetTooSmallError, plan_swaps
from lightning_accudnn.planner.recompute import LastProfileMemo
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

# Budgets as shares of the saved bytes over the static bytes, and the policies planned at each.
SHARES = (0.6, 0.45, 0.3)
POLICIES = ("auto", "recompute", "swap")


def _profile(
    prefix: str, sizes: dict[tuple[int, int], int], times: dict[tuple[int, int], float]
) -> StepProfile:
    """Three stages of four blocks of three layers: 15 candidates, more than every subset of
    which is searched, so the frontiers, the transient-aware program and nested candidates run."""
    layers = []
    segments = []
    for stage in range(3):
        segments.append(SegmentProfile(f"{prefix}.s{stage}", 4_000, 4_000))
        for block in range(4):
            name = f"{prefix}.s{stage}.b{block}"
            saved = sizes.get((stage, block), 40_000 + 10_000 * block)
            scale = times.get((stage, block), 1.0)
            segments.append(SegmentProfile(name, 4_000, 4_000))
            for part, share, seconds in (("conv", 0.5, 3e-3), ("bn", 0.3, 1e-3), ("relu", 0.2, 5e-4)):
                nbytes = int(saved * share)
                layers.append(
                    LayerProfile(f"{name}.{part}", nbytes, nbytes, seconds * scale, 2 * seconds * scale)
                )
    layers.append(LayerProfile(f"{prefix}.head", 8_000, 8_000, 1e-3, 2e-3))
    return StepProfile(tuple(layers), 1_000_000, 5e7, 5e7, segments=tuple(segments))


def _plans(profile: StepProfile) -> list[dict[str, object] | int]:
    """Every cell's plan as plain data, or the smallest budget where none fits."""
    results: list[dict[str, object] | int] = []
    for share in SHARES:
        budget = profile.static_bytes + int(share * profile.saved_bytes)
        for policy in POLICIES:
            try:
                results.append(plan_swaps(profile, budget, policy=policy).to_dict())
            except BudgetTooSmallError as error:
                results.append(error.min_budget_bytes)
    return results


def _decisions(plans: list[dict[str, object] | int]) -> list[object]:
    """What each plan chose (recomputed segments, per-layer choices), without the profile's figures."""
    return [
        plan
        if isinstance(plan, int)
        else (plan["recomputed_segments"], [layer["choice"] for layer in plan["layers"]])  # type: ignore[union-attr]
        for plan in plans
    ]


def _copy(profile: StepProfile) -> StepProfile:
    """An equal profile, another object (as each pass's profile is)."""
    return dataclasses.replace(profile, layers=tuple(dataclasses.replace(layer) for layer in profile.layers))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(
            _profile("replan_times", {}, {}),
            _profile("replan_times", {}, {(0, 0): 4.0, (1, 2): 0.25, (2, 1): 3.0, (2, 3): 0.5}),
            id="timings only",
        ),
        pytest.param(
            _profile("replan_bytes", {}, {}),
            _profile("replan_bytes", {(0, 1): 90_000, (1, 3): 20_000, (2, 0): 120_000}, {}),
            id="bytes",
        ),
    ],
)
def test_a_profile_planned_after_another_gets_its_own_plans(
    first: StepProfile, second: StepProfile, monkeypatch: pytest.MonkeyPatch
):
    with monkeypatch.context() as afresh:
        afresh.setattr(LastProfileMemo, "get", lambda self, profile, key, compute: compute())
        first_alone, second_alone = _plans(first), _plans(second)
    assert _decisions(first_alone) != _decisions(second_alone)  # an answer carried over would show
    assert _plans(first) == first_alone
    assert _plans(_copy(second)) == second_alone
    assert _plans(_copy(first)) == first_alone  # and back
