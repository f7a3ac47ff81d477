"""On a CUDA GPU: regional compilation under the strategy (Inductor's kernels, real memory),
and the experimental partitioner route with PyTorch's asynchronous offload stream."""

import pytest
import torch
from lightning.pytorch import LightningModule

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.compile import PlanPartitioner, offloading_options
from lightning_accudnn.profile import LayerChoice
from tests.compile.helpers import Net, compile_blocks, loss_of
from tests.strategy.helpers import trainer_for

pytestmark = pytest.mark.cuda

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
