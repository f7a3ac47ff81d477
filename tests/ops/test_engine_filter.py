"""What the engine swaps: activations only, each storage once, never parameters or their views."""

import torch
import torch.nn.functional as F
from torch import nn

from lightning_accudnn.ops import HostCopyRuntime, OffloadEngine, SwapSchedule, keep_on_device
from tests.models import MLP, TinyGPT, loss_of, make_batch


class RecordingRuntime(HostCopyRuntime):
    """Host copies that remember the storages they copied out."""

    def __init__(self):
        super().__init__()
        self.sources = []

    def copy_out(self, after, sources, hosts):
        self.sources.extend(sources)  # keep them alive so addresses stay unique
        return super().copy_out(after, sources, hosts)


def _parameter_storages(model):
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def test_parameters_and_weight_transposes_are_never_swapped():
    # nn.Linear saves weight.t(), a view of the parameter: it must be recognised by storage.
    for model, kind in ((MLP(), "mlp"), (TinyGPT(), "gpt")):
        runtime = RecordingRuntime()
        engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)
        with engine.offload(model, SwapSchedule.swap_everything()):
            loss = loss_of(model, make_batch(kind))
        loss.backward()
        engine.end_step()
        copied = {source.untyped_storage().data_ptr() for source in runtime.sources}
        assert runtime.sources
        assert not copied & _parameter_storages(model)


class SharedInput(nn.Module):
    """``x`` is saved by both multiplications (for the gradients of the scales)."""

    def __init__(self):
        super().__init__()
        self.scale_a = nn.Parameter(torch.ones(1))
        self.scale_b = nn.Parameter(torch.ones(1))

    def forward(self, inputs):
        x = torch.sin(inputs)
        return (x * self.scale_a + x * self.scale_b).sum()


def test_a_storage_saved_by_two_ops_is_copied_once():
    model = SharedInput()
    inputs = torch.randn(256, 256, requires_grad=True)  # so that sin saves it
    runtime = RecordingRuntime()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)
    with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = model(inputs)
    loss.backward()
    stats = engine.end_step()
    # sin saves its input; both products save x: two storages move, not three. The newest
    # is still in the copy-out FIFO at the end of forward and is used from the device.
    assert len(runtime.sources) == 2
    assert stats.bytes_swapped_out == 2 * inputs.nbytes
    assert stats.bytes_swapped_in == inputs.nbytes

    swapped_input_grad = inputs.grad.clone()
    inputs.grad = None
    reference = SharedInput()
    reference(inputs).backward()
    assert torch.equal(inputs.grad, swapped_input_grad)
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_small_tensors_excluded_modules_and_keep_on_device_stay():
    model = MLP(width=256)
    batch = make_batch("mlp")
    batch = (torch.randn(64, 256), batch[1].repeat(8))

    def swapped_bytes(engine, keep_block=False):
        with engine.offload(model, SwapSchedule.swap_everything()):
            if keep_block:
                with keep_on_device():
                    loss = loss_of(model, batch)
            else:
                loss = loss_of(model, batch)
        loss.backward()
        return engine.end_step().bytes_swapped_out

    everything = swapped_bytes(OffloadEngine(torch.device("cpu"), min_swap_bytes=0))
    no_body = swapped_bytes(OffloadEngine(torch.device("cpu"), min_swap_bytes=0, exclude=["body", "body.*"]))
    large_only = swapped_bytes(OffloadEngine(torch.device("cpu"), min_swap_bytes=64 * 256 * 4))
    in_block = swapped_bytes(OffloadEngine(torch.device("cpu"), min_swap_bytes=0), keep_block=True)
    assert 0 < no_body < everything
    assert 0 < large_only < everything
    assert in_block == 0


def test_cpu_tensors_are_left_alone_by_a_cuda_engine_filter():
    # An engine for another device does not touch tensors on this one.
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    engine.device = torch.device("meta")
    model = MLP()
    with engine.offload(model, SwapSchedule.swap_everything()):
        loss = F.mse_loss(model(torch.randn(4, 64)), torch.zeros(4, 10))
    loss.backward()
    assert engine.end_step() is None
