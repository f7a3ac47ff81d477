"""The plan table and its JSON say which route the plan is applied by."""

from torch import nn

from lightning_accudnn.planner.plan import ROUTE_EAGER, ROUTE_REGIONAL, plan_swaps
from lightning_accudnn.profile import LayerProfile, StepProfile
from lightning_accudnn.session.compiled import route_of


def test_a_plan_states_its_route_in_the_table_and_the_json():
    plan = plan_swaps(StepProfile((LayerProfile("a", 100, 100),), static_bytes=0), budget_bytes=1_000)
    assert plan.route == ROUTE_EAGER
    assert f"route: {ROUTE_EAGER}" in str(plan)
    assert plan.to_dict()["route"] == ROUTE_EAGER


def test_a_model_with_compiled_blocks_takes_the_regional_route():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert route_of(model) == ROUTE_EAGER
    model[1].compile(backend="eager")
    assert route_of(model) == ROUTE_REGIONAL
