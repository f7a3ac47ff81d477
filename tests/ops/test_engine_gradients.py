"""With swapping on, gradients and weights equal those without it, bit for bit (fp32, CPU)."""

import copy

import pytest
import torch

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from tests.models import loss_of, make_batch, make_model

SCHEDULES = {
    "swap-all, no window": lambda names: SwapSchedule.swap_everything(0, max_copying_out_bytes=0),
    "swap-all, wide window": lambda names: SwapSchedule.swap_everything(2**40, max_copying_out_bytes=2**12),
    "every other layer": lambda names: SwapSchedule.swap_layers_named(names[::2], 2**16, 0),
}


def _train(model, batches, engine=None, schedule=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    grads = []
    for batch in batches:
        optimizer.zero_grad()
        if engine is None:
            loss = loss_of(model, batch)
        else:
            with engine.offload(model, schedule):
                loss = loss_of(model, batch)
        loss.backward()
        if engine is not None:
            stats = engine.end_step()
            assert stats.bytes_swapped_out > 0
            assert stats.bytes_swapped_in > 0
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return grads


def _layer_names(kind):
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    model = make_model(kind)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss_of(model, make_batch(kind)).backward()
    return [usage.name for usage in engine.end_step().layers]


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
def test_gradients_and_weights_bitwise_equal(kind, schedule_name):
    torch.manual_seed(1)
    reference = make_model(kind)
    swapped = copy.deepcopy(reference)
    batches = [make_batch(kind, seed=i) for i in range(3)]
    schedule = SCHEDULES[schedule_name](_layer_names(kind))
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)

    expected = _train(reference, batches)
    actual = _train(swapped, batches, engine, schedule)

    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        for index, (a, b) in enumerate(zip(want, got, strict=True)):
            assert torch.equal(a, b), f"step {step}: gradient of parameter {index} differs"
    for (name, a), b in zip(reference.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs after training"
    assert engine.pool.in_use_bytes == 0


def test_retain_graph_backward_twice_gives_equal_gradients():
    model = make_model("cnn")
    batch = make_batch("cnn")
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.swap_everything()):
        loss = loss_of(model, batch)
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss.backward()
    engine.end_step()
    for a, p in zip(first, model.parameters(), strict=True):
        assert torch.equal(a, p.grad)


class _MixedSaves(torch.nn.Module):
    """Saves of every geometry the engine copies: whole contiguous and channels-last tensors
    (copied as laid out and brought back as the copy itself), a transposed view and a slice
    at an offset (copied as bytes), in fp32, bf16 and int64 (embedding indices)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.conv = torch.nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # saves the int64 indices, whole
        x = torch.tanh(self.proj(x))  # saves its input and output, whole
        y = (x.transpose(0, 1) * 2.0).sin()  # saves a transposed view
        z = x[1:].cos()  # saves a slice at an offset of x's storage
        low = (x.bfloat16() * 3).exp()  # saves bf16 tensors, whole
        image = x.reshape(8, 2, 4, 4).contiguous(memory_format=torch.channels_last)
        conv = torch.relu(self.conv(image))  # saves a channels-last tensor
        return y.sum() + z.sum() + low.float().sum() + conv.sum()


@pytest.mark.parametrize(
    "schedule",
    [SwapSchedule.swap_everything(0, max_copying_out_bytes=0), SwapSchedule.swap_everything(2**40, 2**20)],
    ids=["every copy brought back", "copies read where they were saved"],
)
def test_swapped_saves_of_every_geometry_and_dtype_come_back_bitwise_equal(schedule):
    torch.manual_seed(3)
    reference = _MixedSaves()
    swapped = copy.deepcopy(reference)
    tokens = torch.randint(0, 16, (4, 8))
    loss_of_plain = reference(tokens)
    loss_of_plain.backward()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(swapped, schedule):
        loss = swapped(tokens)
    loss.backward()
    stats = engine.end_step()
    assert torch.equal(loss, loss_of_plain)
    for (name, a), b in zip(reference.named_parameters(), swapped.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), f"gradient of {name} differs"
    assert stats.bytes_swapped_out > 0
    assert (stats.bytes_swapped_in > 0) == (schedule.max_copying_out_bytes == 0)
    assert engine.pool.in_use_bytes == 0
