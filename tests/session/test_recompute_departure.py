"""A pass under a plan that recomputes sees fewer layers than a plain pass: when its layers
saved more than the plan counts for them, in the plan's order, the next plan comes from the
plan's own profile with those bytes raised, not from what the recomputing pass saw."""

from __future__ import annotations

from lightning_accudnn.planner import plan_swaps
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
from lightning_accudnn.session.recompute_pass import profile_to_plan_from

LAYERS = tuple(LayerProfile(f"{block}.{op}", 100, 100, 1e-3, 2e-3) for block in ("one", "two") for op in "ab")
PLAN = plan_swaps(
    StepProfile(LAYERS + (LayerProfile("(root)", 40, 40),), 0, segments=(SegmentProfile("one", 10),)),
    360,
    policy="recompute",
)


def _seen(root_bytes: int, *, order: tuple[str, ...] = ("two.a", "two.b")) -> StepProfile:
    """What a pass recomputing ``one`` sees: its input, the later layers, the loss's saves."""
    later = tuple(LayerProfile(name, 100, 100) for name in order)
    return StepProfile(
        (LayerProfile("one", 10, 10), *later, LayerProfile("(root)", root_bytes, root_bytes)), 0
    )


def test_the_plan_recomputes_the_first_block():
    assert PLAN.recomputed == ("one",)


def test_a_pass_as_the_plan_expects_leaves_the_plan_s_profile():
    assert profile_to_plan_from(PLAN, _seen(40), graph_changed=False) is PLAN.profile


def test_a_layer_saving_more_raises_its_bytes_in_the_plan_s_profile():
    raised = profile_to_plan_from(PLAN, _seen(52), graph_changed=False)
    assert [layer.name for layer in raised.layers] == [layer.name for layer in PLAN.profile.layers]
    assert [layer.saved_bytes for layer in raised.layers] == [100, 100, 100, 100, 52]
    assert raised.segments == PLAN.profile.segments


def test_layers_out_of_the_plan_s_order_are_planned_from_as_seen():
    seen = _seen(40, order=("two.b", "two.a"))
    planned = profile_to_plan_from(PLAN, seen, graph_changed=False)
    assert [layer.name for layer in planned.layers] == [layer.name for layer in seen.layers]
