"""On a CUDA GPU: regional compilation under the strategy (Inductor's kernels, real memory),
and the experimental partitioner route with PyTorch's asynchronous offload stream, alone and
switched on by ``whole_model_compile="experimental"``."""

import pytest
import torch
from lightning.pytorch import LightningModule

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.profile import LayerChoice
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.whole_model_compile import TESTED_TORCH_VERSIONS, PlanPartitioner, offloading_options
from tests.compile.helpers import Net, compile_blocks, loss_of
from tests.strategy.helpers import trainer_for

pytestmark = pytest.mark.cuda

# PyTorch's offload pass changes between releases (2.11's benchmarks nodes, which Inductor's
# deterministic mode refuses): the experimental route is held to the versions it was tested with.
needs_a_tested_torch = pytest.mark.skipif(
    torch.__version__.split("+")[0] not in TESTED_TORCH_VERSIONS,
    reason=f"the experimental partitioner route is tested with PyTorch {', '.join(TESTED_TORCH_VERSIONS)}",
)

BATCH = 4096  # activations of MBs: large enough for the allocator to show what was offloaded


class CompiledBlocks(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = compile_blocks(Net(blocks=4), "inductor", "block.compile()")

    def training_step(self, batch, batch_idx):
        return loss_of(self.net, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _batches():
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, 16, generator=generator), torch.randint(0, 4, (BATCH,))) for _ in range(4)]


def test_regional_compile_swaps_under_the_strategy_on_cuda_and_matches_plain_training():
    plain, swapped = CompiledBlocks(), CompiledBlocks()
    swapped.load_state_dict(plain.state_dict())
    loader = torch.utils.data.DataLoader(_batches(), batch_size=None)
    trainer_for("auto", accelerator="gpu").fit(plain, loader)
    strategy = AccUDNNStrategy(budget="50%", min_swap_bytes=0)
    trainer_for(strategy, accelerator="gpu").fit(swapped, loader)
    assert {f"net.blocks.{i}" for i in range(4)} <= {layer.name for layer in strategy.plan.profile.layers}
    for name, value in plain.state_dict().items():
        torch.testing.assert_close(swapped.state_dict()[name].cpu(), value.cpu(), rtol=1e-5, atol=1e-6)


@needs_a_tested_torch
def test_the_partitioner_route_offloads_on_the_separate_stream_and_saves_device_memory():
    torch.manual_seed(0)
    model = Net(blocks=4).cuda()
    inputs, targets = (t.cuda() for t in _batches()[0])

    def peak_and_grads(partitioner):
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
        compiled = torch.compile(model, options={"custom_partitioner_fn": partitioner})
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with torch._functorch.config.patch(offloading_options(accelerator=True)):
            loss = loss_of(compiled, (inputs, targets))
            forward_peak = torch.cuda.max_memory_allocated()
            loss.backward()
        torch.cuda.synchronize()
        return forward_peak, [p.grad.clone() for p in model.parameters()]

    kept_peak, kept = peak_and_grads(PlanPartitioner({}))
    plan = {f"blocks.{i}": LayerChoice.SWAP for i in range(3)}
    swapped_partitioner = PlanPartitioner(plan)
    swapped_peak, swapped = peak_and_grads(swapped_partitioner)
    assert swapped_partitioner.partitions[0].saved_offloaded, "the offload pass took nothing"
    assert swapped_peak < kept_peak, (swapped_peak, kept_peak)
    for want, got in zip(kept, swapped, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_a_tested_torch
def test_the_whole_model_option_offloads_on_cuda_within_the_budget_and_matches_plain_gradients():
    """``whole_model_compile="experimental"`` with Inductor on CUDA: the planned passes run
    PyTorch's offload pass on its separate stream, peak below the keep-everything plan's and
    within the budget, with the gradients of the model compiled without the session."""
    inputs, targets = (t.cuda() for t in _batches()[0])

    def train(budget):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Net(blocks=4).cuda()
        model.compile()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        config = OffloadConfig(
            budget=budget, reserve_bytes=256 * 2**20, min_swap_bytes=0, whole_model_compile="experimental"
        )
        session = OffloadSession(config, "cuda")
        for _ in range(2):  # the trial, then the plan
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            with session.step(model, optimizer):
                loss = loss_of(model, (inputs, targets))
            loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        route = session.whole_model_route(model)
        session.close()
        return session.plan, route, peak, [p.grad.clone() for p in model.parameters()]

    kept_plan, _, kept_peak, kept = train("90%")
    assert not kept_plan.swapped_layers
    smallest = kept_plan.min_budget_bytes
    budget = smallest + (kept_plan.profile.unconstrained_peak_bytes + kept_plan.reserve_bytes - smallest) // 4
    plan, route, peak, swapped = train(budget)
    assert plan.swapped_layers and route.partitions()[0].saved_offloaded, plan
    assert peak < kept_peak and peak <= budget, (peak, kept_peak, budget)
    for want, got in zip(kept, swapped, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
