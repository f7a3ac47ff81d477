"""Double backward (a gradient penalty inside ``training_step``) under budgets that force swapping.

A backward run inside the forward (``torch.autograd.grad(..., create_graph=True)``) reads
saved activations before the forward is over: those stay on the device for the rest of the
step and are reported as not swappable, so that the plan keeps and counts them; what that
inner backward saves is counted like any save of the layer running. The plan then holds,
so a budget either trains to the end or is refused before any update, naming one that works.
"""

import pytest
import torch
import torch.nn.functional as F

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.planner.plan import BudgetTooSmallError
from tests.models import Classifier, loader
from tests.strategy.helpers import StatsRecorder, copies, memory_need, trainer_for

STEPS = 6


class InputPenalty(Classifier):
    """Cross-entropy plus the squared norm of its gradient with respect to the input: the
    inner backward reads every saved activation of the model during the forward."""

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        inputs = inputs.clone().requires_grad_(True)
        loss = F.cross_entropy(self.model(inputs), targets)
        (grad,) = torch.autograd.grad(loss, inputs, create_graph=True)
        return loss + 0.1 * grad.square().sum()


class MiddlePenalty(Classifier):
    """The penalty on the gradient with respect to the middle block's features: the inner
    backward reads only the last block's and the head's activations, the rest may swap."""

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        net = self.model
        middle = net.blocks[:2](net.stem(inputs))
        logits = net.head(net.blocks[2](middle).mean(dim=(2, 3)))
        loss = F.cross_entropy(logits, targets)
        (grad,) = torch.autograd.grad(loss, middle, create_graph=True)
        return loss + 0.1 * grad.square().sum()


def model_of(cls: type[Classifier]) -> Classifier:
    source, _ = copies("cnn")
    model = cls("cnn")
    model.load_state_dict(source.state_dict())
    return model


def fit(model: Classifier, budget: int) -> tuple[StatsRecorder, AccUDNNStrategy]:
    recorder = StatsRecorder()
    strategy = AccUDNNStrategy(budget=budget, min_swap_bytes=0)
    trainer = trainer_for(strategy, max_steps=STEPS, callbacks=[recorder])
    trainer.fit(model, loader("cnn", batches=STEPS))
    assert trainer.global_step == STEPS
    return recorder, strategy


def assert_within(recorder: StatsRecorder, strategy: AccUDNNStrategy, budget: int) -> None:
    assert strategy.offload.reserve_bytes == 0, "a planned pass overshot its plan (the reserve grew)"
    assert all(stats.peak_device_bytes <= budget for stats in recorder.stats)
    planned = recorder.stats[1:]
    assert planned and all(stats.peak_device_bytes <= stats.predicted_peak_bytes for stats in planned)


@pytest.mark.parametrize("share", [0.6, 2.6])
def test_input_penalty_trains_within_its_budget_or_is_refused_up_front_with_one_that_works(share):
    static, saved = memory_need("cnn")
    budget = static + int(share * saved)
    model = model_of(InputPenalty)
    before = {name: value.clone() for name, value in model.named_parameters()}
    try:
        recorder, strategy = fit(model, budget)
    except BudgetTooSmallError as error:
        after = dict(model.named_parameters())
        unchanged = all(torch.equal(value, after[name]) for name, value in before.items())
        assert unchanged, "refused after an update"
        assert error.min_budget_bytes > budget
        budget = error.min_budget_bytes
        recorder, strategy = fit(model_of(InputPenalty), budget)
    assert_within(recorder, strategy, budget)


def test_middle_penalty_swaps_within_its_budget_bitwise_equal_to_plain_training():
    static, saved = memory_need("cnn")
    plain = model_of(MiddlePenalty)
    trainer_for("auto", max_steps=STEPS).fit(plain, loader("cnn", batches=STEPS))

    budget = static + int(1.5 * saved)  # between the smallest budget and the unconstrained peak
    swapped = model_of(MiddlePenalty)
    recorder, strategy = fit(swapped, budget)
    assert_within(recorder, strategy, budget)
    assert all(stats.bytes_swapped_out > 0 for stats in recorder.stats), "the budget should force swapping"
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs"
