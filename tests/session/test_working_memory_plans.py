"""Plans count the working memory the hooked passes measured, at each level of the step: the
predicted peak is the allocator's, and a budget the saves alone would fit but the working memory
would not is met by the plan, not by a reserve raised after a pass went past it. CPU: the
allocator is the ops' own tensors (:class:`~lightning_accudnn.testing.OpBytesAllocator`)."""

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.session.helpers import run_counted

BATCH, WIDTH, CLASSES, DEPTH = 4096, 64, 50, 8  # activations and logits far above the parameters


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def _classes(width: int, classes: int, size: int):
    """Batches of ``size`` random inputs of ``width`` features and targets among ``classes``."""
    generator = torch.Generator().manual_seed(1)
    return lambda step: (
        torch.randn(size, width, generator=generator),
        torch.randint(0, classes, (size,), generator=generator),
    )


def _cross_entropy(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


def _train(budget: int | str, steps: int, min_swap_bytes: int = 0):
    """``steps`` steps of :func:`_model` under ``budget`` (reserve 0); the planned steps' figures."""
    seen, plan = run_counted(
        _model(),
        _classes(WIDTH, CLASSES, BATCH),
        _cross_entropy,
        steps,
        budget=budget,
        reserve_bytes=0,
        min_swap_bytes=min_swap_bytes,
    )
    return [step for step in seen if step.predicted is not None], plan


def test_with_everything_kept_the_predicted_peak_is_the_allocators():
    """Nothing swappable (the profiling pass keeps everything too): every pass measures the same
    working memory, and the plan's peak is the allocator's to the byte."""
    seen, plan = _train("100%", steps=5, min_swap_bytes=2**40)
    measured, predicted = seen[-1].peak, seen[-1].predicted
    assert plan.swapped_bytes == 0 and not plan.recomputed
    assert measured > plan.profile.static_bytes + plan.profile.saved_bytes  # the loss's, above all
    assert [step.peak for step in seen] == [step.predicted for step in seen]
    assert plan.predicted_peak_bytes == predicted == measured


def test_a_budget_the_saves_fit_but_the_working_memory_does_not_is_met_by_the_plan():
    kept, plan = _train("100%", steps=4)
    ledger_need = plan.profile.static_bytes + plan.profile.saved_bytes
    allocated_need = kept[-1].peak
    assert ledger_need < allocated_need
    budget = (ledger_need + allocated_need) // 2  # fits the saves, not their working memory
    seen, plan = _train(budget, steps=8)
    assert plan.swapped_bytes > 0 or plan.recomputed
    for step in seen:
        assert step.reserve == 0, "a pass went past its room: the plan did not count the working memory"
        assert step.predicted is not None and step.peak <= step.predicted <= step.usable


def test_plans_count_the_most_each_layer_held_in_any_pass():
    """The profiling pass swaps everything; an activation swapped while the model's code still
    holds it is working memory there, saved bytes under a plan that keeps it. Plans keep the most
    of both for every layer, so that a plan swapping what an earlier one kept is not under-counted."""
    seen, plan = run_counted(
        _model(), _classes(WIDTH, CLASSES, BATCH), _cross_entropy, 4, budget="100%", min_swap_bytes=0
    )
    history = [
        [(layer.forward_working_bytes, layer.backward_working_bytes) for layer in step.profile.layers]
        + [(step.profile.outside_working_bytes, 0)]
        for step in seen
    ]
    assert plan.swapped_bytes == 0  # the plans keep everything; the profiling pass did not
    for earlier, later in zip(history, history[1:], strict=False):
        assert all(a <= b and c <= d for (a, c), (b, d) in zip(earlier, later, strict=True))
    assert any(value for pair in history[0] for value in pair)  # the profiling pass measured some


class ScaledFirst(nn.Module):
    """Saves in its own code before its first layer (the scaling), so that the layer of the
    loss's saves, the step's own code, comes first in the order of first saves."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(WIDTH))
        self.body = _model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x * self.scale)


def test_the_loss_is_charged_right_when_its_layer_saved_first():
    seen, plan = run_counted(
        ScaledFirst(), _classes(WIDTH, CLASSES, BATCH), _cross_entropy, 4, budget="100%", min_swap_bytes=2**40
    )
    assert plan.profile.layers[0].name == "(root)"
    assert all(step.peak == step.predicted for step in seen[1:])


def test_gradients_not_made_yet_are_taken_off_the_levels_before_them():
    """Model state counts the parameters' gradients all step; a step that sets them to ``None``
    makes them in its backward. Where they dwarf the activations, the levels before them hold
    less than the ledger counts, and the prediction is still the allocator's peak."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 10)
    )
    seen, plan = run_counted(
        model, _classes(1024, 10, 64), _cross_entropy, 4, budget="100%", min_swap_bytes=2**40
    )
    profile = plan.profile
    assert profile.static_bytes + profile.saved_bytes > seen[-1].peak  # the ledger counts more
    assert all(step.peak == step.predicted for step in seen[1:])
    assert any(layer.forward_working_bytes < 0 for layer in profile.layers)


def _cnn_peaks(budget: int | str, policy: str, steps: int):
    """The planned steps of the test CNN (batch 32, SGD with momentum) under ``budget``, and the
    last plan."""
    from tests.models import loss_of, make_batch, make_model

    torch.manual_seed(0)
    seen, plan = run_counted(
        make_model("cnn"),
        lambda step: make_batch("cnn", batch_size=32, seed=step),
        loss_of,
        steps,
        momentum=0.9,
        budget=budget,
        min_swap_bytes=0,
        policy=policy,
        reserve_bytes=0,
    )
    return [step for step in seen if step.predicted is not None], plan


def test_a_plan_that_recomputes_is_predicted_from_the_profiling_pass_without_its_swaps():
    """The profiling pass swaps everything: the storages it let go while the model's code still
    held them are no working memory of a plan that keeps them or recomputes around them, and the
    plan that recomputes (planned from that pass) is predicted within a few percent, never under."""
    kept, _ = _cnn_peaks("100%", "auto", steps=4)
    seen, plan = _cnn_peaks(int(0.7 * kept[-1].peak), "recompute", steps=6)
    assert plan.recomputed and not plan.swapped_bytes
    assert all(step.predicted is not None and step.peak <= step.predicted for step in seen)
    assert seen[-1].predicted is not None and seen[-1].predicted <= 1.05 * seen[-1].peak


def test_the_batch_the_step_holds_is_kept_on_the_device_and_counted_once():
    """The first layer saves the batch, which the loop holds all step: the profiling pass swaps it
    and finds it still alive when the forward ends, so plans keep it (a swap frees nothing) and
    count it once, as saved bytes, not again as working memory. (What is left over the
    allocator's peak is the profiling pass's storages let go between two readings: alive at the
    peak between them or not, they are counted.)"""
    seen, plan = run_counted(
        _model(), _classes(WIDTH, CLASSES, BATCH), _cross_entropy, 5, budget="100%", min_swap_bytes=0
    )
    first = plan.profile.layers[0]
    batch_bytes = BATCH * WIDTH * 4
    assert first.saved_bytes - first.swappable_bytes == batch_bytes
    for step in seen[1:]:
        assert step.predicted is not None and step.peak <= step.predicted < step.peak + batch_bytes // 2


class TanhBetween(nn.Module):
    """Its own code saves between its layers (a functional tanh) and, through the loss, after the
    last: two stretches of the step's own code, each a layer where it saves."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        pairs = [(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(4)]
        self.first = nn.Sequential(*(module for pair in pairs for module in pair))
        self.last = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.tanh(self.first(x)))


def test_the_step_s_own_code_saving_between_layers_and_for_the_loss_is_two_layers():
    """The loss's saves (the log-probabilities, the largest) come last in the order, so a plan
    that swaps them is predicted to bring them back first in backward, as the engine does: the
    prediction is never under the allocator's peak."""
    kept, _ = run_counted(
        TanhBetween(), _classes(WIDTH, CLASSES, BATCH), _cross_entropy, 3, budget="100%", min_swap_bytes=0
    )
    names = [layer.name for layer in kept[-1].profile.layers]
    assert [name for name in names if name.startswith("(root)")] == ["(root)", "(root)#2"]
    assert names.index("(root)") < names.index("last.1") < names.index("(root)#2") == len(names) - 1
    for fraction in (0.9, 0.8):
        seen, plan = run_counted(
            TanhBetween(),
            _classes(WIDTH, CLASSES, BATCH),
            _cross_entropy,
            5,
            budget=int(fraction * kept[-1].peak),
            reserve_bytes=0,
            min_swap_bytes=0,
        )
        planned = [step for step in seen if step.predicted is not None]
        assert planned and all(step.peak <= step.predicted for step in planned), (fraction, planned)


def test_a_plan_made_before_the_optimizer_made_its_state_counts_that_state():
    """The profiling pass runs before the optimizer's first step: its working memory, measured
    against a model state that counts Adam's moments to come, is that much low. The plans made
    from it hold them all the same, and no step is above its prediction."""
    model = _model()
    seen, plan = run_counted(
        model,
        _classes(WIDTH, CLASSES, BATCH),
        _cross_entropy,
        4,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        counted_optimizer=True,
        budget="100%",
        reserve_bytes=0,
        min_swap_bytes=2**40,
    )
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    planned = [step for step in seen if step.predicted is not None]
    assert all(step.peak <= step.predicted for step in planned), [(s.peak, s.predicted) for s in planned]
    # Over by Adam's step counters alone (a float each, counted as model state).
    assert planned[-1].predicted - planned[-1].peak < moments // 100


def test_autocast_weight_copies_are_counted_once_in_the_model_state():
    """Under autocast the profiling pass first finds the weight copies, and measured them as
    working memory; the plans count them as model state from then on, and only there."""
    model = _model()
    seen, plan = run_counted(
        model,
        _classes(WIDTH, CLASSES, BATCH),
        _cross_entropy,
        4,
        autocast=True,
        budget="100%",
        reserve_bytes=0,
        min_swap_bytes=2**40,
    )
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    copies = plan.profile.static_bytes - 2 * parameters  # beside the weights and their gradients
    assert copies > 0, "the test needs autocast's weight copies in the model state"
    planned = [step for step in seen if step.predicted is not None]
    assert all(step.peak <= step.predicted for step in planned)
    assert planned[-1].predicted - planned[-1].peak < copies, "the copies are counted twice"


def _wide() -> nn.Module:
    """Large weights, small activations (with a batch of 8)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, CLASSES)
    )


@pytest.mark.parametrize(
    ("make_model", "width", "size", "make_optimizer"),
    [
        (_model, WIDTH, BATCH, lambda model: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)),
        (_model, WIDTH, BATCH, lambda model: torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)),
        (_wide, 512, 8, lambda model: torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)),
    ],
    ids=["sgd-momentum", "adam-foreach", "adam-foreach-large-weights"],
)
def test_the_smallest_budget_named_before_the_optimizer_stepped_holds_its_state_and_its_step(
    make_model, width, size, make_optimizer
):
    """A budget too small is refused, naming the least that works: the profiling pass's peak, in
    which the optimizer's state was still to come, with it (Adam's step counters too), and at
    least what the optimizer's first step holds beside it (Adam's multi-tensor step: the square
    roots of its second moments, one list, which large weights make the most the step holds).
    Training at it never goes past it."""
    from lightning_accudnn.planner import BudgetTooSmallError

    def train(budget: int):
        model = make_model()
        return run_counted(
            model,
            _classes(width, CLASSES, size),
            _cross_entropy,
            5,
            optimizer=make_optimizer(model),
            counted_optimizer=True,
            budget=budget,
            reserve_bytes=0,
            min_swap_bytes=0,
        )

    try:
        train(10**6)
    except BudgetTooSmallError as refused:
        named = refused.min_budget_bytes
    else:
        raise AssertionError("a budget of 1 MB should be refused")
    seen, _ = train(named)
    assert all(step.reserve == 0 for step in seen), "a pass went past the budget named"
    assert all(step.peak <= named for step in seen if step.predicted is not None)


def test_plans_recomputing_under_autocast_count_the_weight_copies_of_the_segments_they_recompute():
    """Autograd never saves the weight copies of a recomputed segment's layers, but autocast
    makes them all the same: a pass under a plan that recomputes sees fewer, and the plans made
    after it still count them all."""

    width, size = 512, 1024  # weights (and their copies) of the size of a block's saves

    def blocks() -> nn.Module:
        torch.manual_seed(0)
        stages = [
            nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
            for _ in range(6)
        ]
        return nn.Sequential(*stages, nn.Linear(width, CLASSES))

    def train(budget, steps: int, policy: str):
        return run_counted(
            blocks(),
            _classes(width, CLASSES, size),
            _cross_entropy,
            steps,
            momentum=0.9,
            counted_optimizer=True,
            autocast=True,
            budget=budget,
            reserve_bytes=0,
            min_swap_bytes=0,
            policy=policy,
        )

    from lightning_accudnn.planner import BudgetTooSmallError

    kept, _ = train("100%", 3, "auto")
    try:
        train(10**6, 2, "recompute")
    except BudgetTooSmallError as refused:
        least = refused.min_budget_bytes
    else:
        raise AssertionError("a budget of 1 MB should be refused")
    seen, plan = train((least + kept[-1].peak) // 2, 6, "recompute")
    assert plan.recomputed, "the test needs a plan that recomputes"
    planned = [step for step in seen if step.predicted is not None]
    assert all(step.reserve == 0 for step in seen), "a pass went past its room"
    assert all(step.peak <= step.predicted for step in planned), [(s.peak, s.predicted) for s in planned]


VOCABULARY = 4000  # the loss's logits and log-probabilities: most of the step


def _wide_head() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, VOCABULARY))


def test_log_probabilities_freed_before_the_forward_ends_are_counted_once():
    """The profiling pass swaps the loss's log-probabilities and lets them go once copied; the
    loss frees them when it returns, before the forward ends. A plan that keeps them counts
    them once, as saves, not again as working memory at the loss's level."""
    seen, plan = run_counted(
        _wide_head(), _classes(WIDTH, VOCABULARY, 512), _cross_entropy, 3, budget="100%", reserve_bytes=0
    )
    assert not plan.swapped_layers
    planned = [step for step in seen if step.predicted is not None]
    assert planned and all(step.peak <= step.predicted <= 1.01 * step.peak for step in planned), planned


def _cross_entropy_then_a_save(model: nn.Module, batch) -> torch.Tensor:
    """The loss, then one more save: the log-probabilities leave the copy-out FIFO in forward."""
    inputs, targets = batch
    logits = model(inputs)
    return nn.functional.cross_entropy(logits, targets) * logits[:1].tanh().mean()


def test_log_probabilities_let_go_in_forward_are_not_the_loss_s_working_memory():
    """The profiling pass lets the log-probabilities go once copied, in forward, and they are
    freed at once: the loss's forward level holds the logits beyond its saves, not those bytes
    again (the allocator's peak read before they were freed held them)."""
    seen, _ = run_counted(
        _wide_head(),
        _classes(WIDTH, VOCABULARY, 512),
        _cross_entropy_then_a_save,
        3,
        budget="100%",
        reserve_bytes=0,
        min_swap_bytes=0,
    )
    log_probabilities = logits = 512 * VOCABULARY * 4
    loss = seen[0].profile.layers[-1]
    assert loss.name == "(root)" and loss.retired_alive_bytes == log_probabilities
    assert loss.forward_working_bytes <= logits
    planned = [step for step in seen if step.predicted is not None]
    assert planned and all(step.peak <= step.predicted <= 1.01 * step.peak for step in planned), planned


class _Checkpointed(nn.Module):
    """A non-reentrant checkpoint around ``inner``: it saves its input, which its backward reads
    to recompute ``inner`` before ``inner``'s own backward, and lets go of after it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def test_a_checkpoint_s_input_brought_back_is_counted_as_long_as_a_kept_one_lives():
    """A non-reentrant checkpoint reads the input it saved when its backward begins (to
    recompute its segment): kept, the input lives until the segment's backward is over (autograd
    holds it), while the copy the profiling pass brought back died as soon as the recomputation
    had read it. Measured that way, the plan that keeps everything, made from the profiling pass,
    was predicted a storage short of what its step held (22,616 B held, 20,568 predicted). The
    plans made from the profiling pass predict what the steps hold, and the refined ones the same."""
    torch.manual_seed(0)
    width = 32
    model = nn.Sequential(
        nn.Linear(16, width),
        _Checkpointed(nn.Sequential(nn.Tanh(), nn.Linear(width, width))),
        nn.Tanh(),
        nn.Linear(width, 10),
    )
    seen, _ = run_counted(
        model, _classes(16, 10, 16), _cross_entropy, 3, budget=10**10, reserve_bytes=0, min_swap_bytes=0
    )
    profiling, *planned = seen
    assert profiling.predicted is None and profiling.swapped > 0, "the profiling pass swaps everything"
    assert all(step.swapped == 0 for step in planned)
    assert [step.peak for step in planned] == [step.predicted for step in planned], [
        (step.peak, step.predicted) for step in planned
    ]
