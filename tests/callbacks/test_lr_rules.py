"""Learning-rate rules, warmup and schedule scaling on plain PyTorch optimizers and schedulers."""

import math

import pytest
import torch
from torch.optim import lr_scheduler as schedulers

from lightning_accudnn.callbacks import (
    LinearWarmup,
    WarmupOverlay,
    lr_factor,
    rescale_step_counts,
    rule_for,
    scale_learning_rates,
)


def _optimizer(kind: str = "sgd", lr: float = 0.1) -> torch.optim.Optimizer:
    params = torch.nn.Linear(3, 2).parameters()
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _run(optimizer, scheduler, steps: int) -> list[float]:
    """The learning rate each of ``steps`` optimizer steps uses, stepping the scheduler after each."""
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def test_rules():
    assert lr_factor("linear", 8.0) == 8.0
    assert lr_factor("sqrt", 9.0) == 3.0
    assert lr_factor("none", 9.0) == 1.0
    assert lr_factor(lambda ratio: ratio**0.5 * 2, 4.0) == 4.0
    assert lr_factor("linear", 0.25) == 0.25  # a smaller batch lowers the rate
    with pytest.raises(ValueError, match="unknown learning-rate rule"):
        lr_factor("cubic", 2.0)
    with pytest.raises(ValueError, match="factor > 0"):
        lr_factor(lambda ratio: -1.0, 2.0)


def test_auto_rule_is_linear_for_sgd_and_sqrt_for_adam_type():
    params = [torch.nn.Parameter(torch.zeros(1))]
    assert rule_for(torch.optim.SGD(params, lr=0.1)) == "linear"
    for kind in (torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.Adagrad):
        assert rule_for(kind(params)) == "sqrt"
    assert rule_for(torch.optim.AdamW(params), "none") == "none"


def test_linear_warmup_is_goyal_ramp_and_a_lambda_lr_function():
    warmup = LinearWarmup(steps=4, start_factor=0.25)
    assert [warmup(step) for step in range(6)] == [0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0]
    optimizer = _optimizer(lr=0.4)
    used = _run(optimizer, schedulers.LambdaLR(optimizer, warmup), 6)
    assert used == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    assert LinearWarmup(steps=0)(0) == 1.0


def test_warmup_overlay_multiplies_a_chainable_schedule_without_changing_it():
    """StepLR computes from the group's current rate: the warmup must not leak into it."""
    plain = _optimizer(lr=0.4)
    plain_lrs = _run(plain, schedulers.StepLR(plain, step_size=2, gamma=0.5), 8)

    optimizer = _optimizer(lr=0.4)
    scheduler = schedulers.StepLR(optimizer, step_size=2, gamma=0.5)
    step = [0]
    overlay = WarmupOverlay([LinearWarmup(steps=4, start_factor=0.25)], step=lambda: step[0])
    overlay.attach([optimizer])
    used = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    outside = []
    for step[0] in range(8):
        optimizer.step()
        outside.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    overlay.detach()
    warmup = LinearWarmup(steps=4, start_factor=0.25)
    assert used == pytest.approx([lr * warmup(i) for i, lr in enumerate(plain_lrs)])
    assert outside == pytest.approx(plain_lrs)  # between steps: the unwarmed schedule


@pytest.mark.parametrize(
    "make",
    [
        lambda o: schedulers.StepLR(o, step_size=3, gamma=0.5),
        lambda o: schedulers.MultiStepLR(o, milestones=[2, 5], gamma=0.1),
        lambda o: schedulers.CosineAnnealingLR(o, T_max=10, eta_min=0.001),
        lambda o: schedulers.OneCycleLR(o, max_lr=0.1, total_steps=10),
        lambda o: schedulers.OneCycleLR(o, max_lr=0.1, total_steps=10, three_phase=True),
        lambda o: schedulers.LambdaLR(o, lambda step: 1 / (1 + step)),
        lambda o: schedulers.ExponentialLR(o, gamma=0.9),
        lambda o: schedulers.LinearLR(o, start_factor=0.5, total_iters=4),
        lambda o: schedulers.SequentialLR(
            o, [schedulers.LinearLR(o, 0.5, total_iters=3), schedulers.ExponentialLR(o, 0.9)], milestones=[3]
        ),
        lambda o: schedulers.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3),
    ],
    ids=[
        "step",
        "multistep",
        "cosine",
        "onecycle",
        "onecycle3",
        "lambda",
        "exponential",
        "linear",
        "sequential",
        "cyclic",
    ],
)
def test_scaling_a_live_optimizer_scales_the_whole_schedule(make):
    reference = _optimizer(lr=0.1)
    expected = _run(reference, make(reference), 10)
    optimizer = _optimizer(lr=0.1)
    scheduler = make(optimizer)
    scale_learning_rates(optimizer, [scheduler], 4.0)
    assert _run(optimizer, scheduler, 10) == pytest.approx([4.0 * lr for lr in expected])


@pytest.mark.parametrize("ratio", [0.25, 3.0])
@pytest.mark.parametrize("three_phase", [False, True])
def test_one_cycle_rescaled_equals_one_built_for_the_new_length(ratio, three_phase):
    total = 40
    new_total = math.ceil(total * ratio)
    reference = _optimizer()
    reference_schedule = schedulers.OneCycleLR(
        reference, max_lr=0.4, total_steps=new_total, three_phase=three_phase
    )
    expected = _run(reference, reference_schedule, new_total)

    optimizer = _optimizer()
    scheduler = schedulers.OneCycleLR(optimizer, max_lr=0.1, total_steps=total, three_phase=three_phase)
    scale_learning_rates(optimizer, [scheduler], 4.0)
    assert rescale_step_counts(scheduler, ratio)
    assert _run(optimizer, scheduler, new_total) == pytest.approx(expected)  # no "Tried to step" either


def test_step_counted_lengths_are_rescaled_and_unknown_ones_reported():
    optimizer = _optimizer()
    cosine = schedulers.CosineAnnealingLR(optimizer, T_max=100)
    assert rescale_step_counts(cosine, 0.25) and cosine.T_max == 25
    step = schedulers.StepLR(optimizer, step_size=10)
    assert rescale_step_counts(step, 0.5) and step.step_size == 5
    multistep = schedulers.MultiStepLR(optimizer, milestones=[30, 80])
    assert rescale_step_counts(multistep, 0.5) and sorted(multistep.milestones) == [15, 40]
    exponential = schedulers.ExponentialLR(optimizer, gamma=0.81)
    assert rescale_step_counts(exponential, 2.0) and exponential.gamma == pytest.approx(0.9)
    assert not rescale_step_counts(schedulers.LambdaLR(optimizer, lambda step: 1.0), 0.5)
