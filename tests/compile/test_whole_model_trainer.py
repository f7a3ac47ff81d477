"""The experimental whole-model route under the Lightning strategies: ``AccUDNNStrategy`` trains a
LightningModule compiled whole (both ways Lightning knows) with the plan applied in its
partitioner and the same weights as plain Lightning; ``AccUDNNDDPStrategy`` refuses the option."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import LightningModule

from lightning_accudnn import AccUDNNDDPStrategy, AccUDNNStrategy
from lightning_accudnn.planner.plan import ROUTE_WHOLE_MODEL, plan_swaps
from lightning_accudnn.profile import LayerChoice
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.whole_model_compile import plan_choices
from lightning_accudnn.whole_model_compile.route import WholeModelRoute
from tests.compile.helpers import Net, batches, loss_of
from tests.strategy.helpers import trainer_for

STEPS = 3
ROUTE = {"whole_model_compile": "experimental", "whole_model_backend": "aot_eager", "min_swap_bytes": 0}


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = Net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return loss_of(self, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loader():
    return torch.utils.data.DataLoader(batches(STEPS), batch_size=None)


@pytest.fixture(autouse=True)
def dynamo_reset():
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def plain_weights():
    module = Classifier()
    trainer_for("auto", max_steps=STEPS).fit(module, _loader())
    return module.state_dict()


@pytest.fixture(scope="module")
def tight_budget() -> int:
    """A budget under which the plan swaps some of the module's layers and keeps others."""
    module = Classifier()
    route = WholeModelRoute("aot_eager", accelerator=False)
    with route.compiled():
        loss_of(torch.compile(module, backend="eager"), batches(1)[0])
    profile = route.trial_profile(model_state_bytes(module, [module.configure_optimizers()]), 0)
    smallest = plan_swaps(profile, profile.unconstrained_peak_bytes).min_budget_bytes
    return smallest + (profile.unconstrained_peak_bytes - smallest) // 4


def _lightning_module_compile():
    module = Classifier()
    module.compile(backend="eager")  # LightningModule.compile(): nn.Module's in-place form
    return module, module


def _torch_compile():
    module = Classifier()
    return module, torch.compile(module, backend="eager")  # Lightning unwraps it, compiles training_step


@pytest.mark.parametrize(
    "make",
    [_lightning_module_compile, _torch_compile],
    ids=["LightningModule.compile()", "torch.compile(model)"],
)
def test_the_strategy_trains_a_model_compiled_whole_on_the_experimental_route(
    make, tight_budget, plain_weights
):
    module, given = make()
    strategy = AccUDNNStrategy(budget=tight_budget, **ROUTE)
    trainer_for(strategy, max_steps=STEPS).fit(given, _loader())

    plan = strategy.plan
    assert plan is not None and plan.route == ROUTE_WHOLE_MODEL
    swapped = {layer for layer, choice in plan_choices(plan).items() if choice is LayerChoice.SWAP}
    assert swapped and swapped != set(plan_choices(plan)), plan  # the budget makes it choose
    route = strategy.offload.whole_model_route(module)
    assert route is not None
    (partition,) = route.partitions()
    assert set(partition.offloaded) == swapped and partition.saved_offloaded
    for name, value in module.state_dict().items():
        assert torch.equal(value, plain_weights[name]), name


def test_the_ddp_strategy_refuses_the_option_naming_where_it_is_served():
    with pytest.raises(ValueError, match=r"served by AccUDNNStrategy and OffloadSession .* not under DDP"):
        AccUDNNDDPStrategy(budget="1GB", whole_model_compile="experimental")
