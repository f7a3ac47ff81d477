"""Variable batch shapes: a new sequence length or image size is planned from the shapes
already measured (reused when a plan covers it, else scaled), not profiled again; every step
stays within the budget and trains bitwise like the loop without the session."""

from __future__ import annotations

import copy
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session.plan_book import PlanSource
from lightning_accudnn.testing import SimulatedGPU
from tests.models import SmallResNet, TinyGPT, TransformerBlock, loss_of, make_batch, make_model
from tests.session.helpers import class_rows, cross_entropy_of, run_counted, sgd
from tests.session_training import measured_pass

VOCAB = 50


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one intra-op thread (several spin-waiting threads on a loaded machine make a
    millisecond backward take a second)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _images(batch: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=generator), torch.randint(
        0, 10, (batch,), generator=generator
    )


def _cnn_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _memory_need(model: nn.Module, loss_of, batch) -> tuple[int, int]:
    """(model state with SGD-momentum state, saved activations) of one step of ``batch``."""
    model = copy.deepcopy(model)
    stats = measured_pass(model, lambda module: loss_of(module, batch))
    return model_state_bytes(model, [sgd(model)]), sum(layer.saved_bytes for layer in stats.layers)


def _train(session, model, loss_of, batches, gpu=None):
    """Train ``model`` under ``session`` and a copy without it on ``batches``; gradients must be
    bitwise equal at every step. Returns each step's stats and the simulated GPU's held peak."""
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = sgd(model), sgd(reference)
    steps = []
    for index, batch in enumerate(batches):
        with session.step(model, optimizer):
            loss = loss_of(model, batch)
        loss.backward()
        held = None
        if gpu is not None:
            held = gpu.peak_held_bytes
            gpu.reset_peaks()
        steps.append((session.stats, held))
        loss_of(reference, batch).backward()
        for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad), (
                f"step {index}: the gradient of {name} differs"
            )
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    return steps


def _sources(steps) -> list[str]:
    return [stats.plan_source.value for stats, _ in steps]


class EagerAttentionBlock(TransformerBlock):
    """Attention written out (as eager attention in Hugging Face models): the softmax weights
    saved for backward are ``length x length`` per head, so bytes grow with the square."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (dim // self.heads) ** 0.5
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


def _gpt(attention: str) -> TinyGPT:
    model = TinyGPT(vocab=VOCAB, dim=32, layers=2, length=64)
    if attention == "eager":
        model.blocks = nn.Sequential(*[EagerAttentionBlock(32) for _ in range(2)])
    return model


@pytest.mark.parametrize(
    ("attention", "lag", "order"),
    # Lengths that only grow are the hard case for scaling: every step is a new, longer shape
    # (quadratic attention bytes counted as linear would pass the budget there).
    [("sdpa", 0, "shuffled"), ("eager", None, "shuffled"), ("eager", 0, "growing")],
)
def test_gpt_with_dynamic_padding_over_24_lengths_profiles_once_and_keeps_the_budget(attention, lag, order):
    torch.manual_seed(0)
    model = _gpt(attention)
    lengths = list(range(17, 65, 2))  # 24 lengths (the model sees each less one token)
    if order == "shuffled":
        random.Random(0).shuffle(lengths)
    static, saved = _memory_need(model, _lm_loss, _tokens(4, max(lengths), seed=0))
    budget = static + int(0.5 * saved)  # the longest batches must swap
    gpu = SimulatedGPU(lag=lag, seed=3)
    config = OffloadConfig(budget=budget, min_swap_bytes=0, policy="swap")
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(config, "cpu", runtime=gpu) as session:
        batches = [_tokens(4, length, seed=i) for i, length in enumerate(lengths)]
        steps = _train(session, model, _lm_loss, batches, gpu=gpu)
        planned = session.plan

    sources = _sources(steps)
    assert len(set(lengths)) >= 20 and len(steps) == len(lengths)
    assert sources.count("profiling") <= 2, sources
    assert sources[0] == "profiling"
    assert set(sources[1:]) == ({"scaled", "covered"} if order == "shuffled" else {"scaled"}), sources
    assert planned.swapped_layers, "the budget should force swapping"
    assert gpu.violations == []
    for (stats, held), length in zip(steps, lengths, strict=True):
        assert stats.ledger_peak_bytes <= budget, f"length {length} ({stats.plan_source.value})"
        assert static + held <= budget, f"length {length}: the simulated GPU held more than the budget"


def test_cnn_over_several_image_sizes_profiles_once_and_keeps_the_budget():
    torch.manual_seed(0)
    model = SmallResNet(channels=8, blocks=2)
    sizes = [16, 12, 20, 8, 24, 14, 16, 20, 10, 24]
    static, saved = _memory_need(model, _cnn_loss, _images(4, max(sizes), seed=0))
    budget = static + int(0.5 * saved)
    config = OffloadConfig(budget=budget, min_swap_bytes=0, policy="swap")
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(config, "cpu") as session:
        batches = [_images(4, size, seed=i) for i, size in enumerate(sizes)]
        steps = _train(session, model, _cnn_loss, batches)

    sources = _sources(steps)
    assert sources.count("profiling") == 1, sources
    assert "scaled" in sources and "covered" in sources, sources
    assert all(stats.ledger_peak_bytes <= budget for stats, _ in steps)
    assert any(
        stats.bytes_swapped_out > 0 for stats, _ in steps if stats.plan_source is not PlanSource.PROFILING
    )


class BranchyGPT(TinyGPT):
    """A decoder that runs an extra block on long sequences only: its layers differ by shape."""

    def __init__(self) -> None:
        super().__init__(vocab=VOCAB, dim=32, layers=1, length=64)
        self.extra = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.embed(tokens) + self.position[: tokens.shape[1]])
        if tokens.shape[1] > 24:
            x = x + self.extra(x)
        return self.lm_head(self.norm(x))


def test_a_pass_whose_layers_differ_is_planned_from_its_own_measurements_within_the_budget():
    torch.manual_seed(0)
    model = BranchyGPT()
    lengths = [17, 21, 41, 41, 49, 13, 49, 21]  # 41 and 49 take the branch
    static, saved = _memory_need(model, _lm_loss, _tokens(4, max(lengths), seed=0))
    budget = static + int(0.5 * saved)
    config = OffloadConfig(budget=budget, min_swap_bytes=0, policy="swap")
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(config, "cpu") as session:
        plans = []
        reference_steps = []
        for length in lengths:
            steps = _train(session, model, _lm_loss, [_tokens(4, length, seed=length)])
            reference_steps += steps
            plans.append(session.plan)

    sources = _sources(reference_steps)
    assert sources.count("profiling") == 1, sources
    # 41: the first long pass runs a plan scaled from 21 (without the branch's layers, which it
    # swaps); its measured layers differ, so the second 41 runs a plan made from its own.
    assert sources[2] == "scaled" and sources[3] == "refined", sources
    names = {layer.name for layer in plans[3].profile.layers}
    assert any(name.startswith("extra") for name in names), sorted(names)
    assert not any(name.startswith("extra") for name in (layer.name for layer in plans[1].profile.layers))
    # 49 is planned from 41's measured profile (the one with the branch), not from 21's.
    assert any(name.startswith("extra") for name in (layer.name for layer in plans[4].profile.layers))
    assert all(stats.ledger_peak_bytes <= budget for stats, _ in reference_steps)


def test_the_short_last_batch_of_an_epoch_is_scaled_not_profiled():
    torch.manual_seed(0)
    model = TinyGPT(vocab=VOCAB, dim=32, layers=2, length=32)
    tokens = _tokens(27, 33, seed=0)  # 27 sequences in batches of 8: the last batch holds 3
    static, saved = _memory_need(model, _lm_loss, tokens[:8])
    budget = static + int(0.3 * saved)
    # Plans made at the end of their pass: which plan each pass runs is what is checked.
    config = OffloadConfig(budget=budget, min_swap_bytes=0, policy="swap", plan_in_background=False)
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(config, "cpu") as session:
        epochs = 2
        steps = _train(
            session, model, _lm_loss, [tokens[i : i + 8] for _ in range(epochs) for i in range(0, 27, 8)]
        )

    sources = _sources(steps)
    assert sources == ["profiling", "profiled", "refined", "scaled"] + ["refined"] * 4, sources
    short = steps[3][0]
    assert short.bytes_swapped_out > 0 and short.ledger_peak_bytes <= budget
    assert all(stats.ledger_peak_bytes <= budget for stats, _ in steps)


def test_a_shape_run_under_a_larger_shapes_plan_borrows_its_times_at_its_own_bytes():
    """A smaller batch runs the plan of a larger one (``covered``); its passes replayed untimed
    borrow the plan's layer times and re-saves, which that plan measured at the larger shape:
    they are taken at the smaller shape's bytes (a re-save of 512 rows does not fit a layer
    that saved 256), and the run trains on, bitwise like the loop without the session, through
    the re-cost of its timed passes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))  # Tanh's output, saved again
    batches = [
        torch.randn(rows, 64, generator=torch.Generator().manual_seed(i))
        for i, rows in enumerate([512] * 3 + [256] * 8)
    ]
    config = OffloadConfig(budget="8GB", min_swap_bytes=0, plan_in_background=False)
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(config, "cpu") as session:
        steps = _train(session, model, lambda module, x: module(x).square().mean(), batches)
    sources = _sources(steps)
    assert sources[:4] == ["profiling", "profiled", "refined", "covered"], sources
    assert len(steps) == len(batches)


@pytest.mark.parametrize(("policy", "share"), [("auto", 0.6), ("swap", 0.6), ("recompute", 0.7)])
def test_a_cnn_over_shrinking_and_regrowing_batches_stays_within_its_predictions(policy, share):
    """SmallResNet (its ReLUs' outputs saved again by the next convolution) at 0.6 of its kept
    peak (0.7 keeping or recomputing: its least such plan needs 0.61), every tensor swappable,
    over batches that shrink below the first and grow back: shapes run under a larger one's
    plan, are planned from scaled profiles and refine their own. Every step trains, and none
    passes its predicted peak (the ops' own tensors as the allocator)."""
    sizes = [8, 8, 8, 5, 6, 6, 4, 5, 5, 6, 5, 4, 3, 8]
    kept, _ = run_counted(
        make_model("cnn"), lambda step: make_batch("cnn", 8, seed=step), loss_of, 3, budget=10**10
    )
    budget = int(share * max(step.peak for step in kept))
    torch.manual_seed(0)
    seen, _ = run_counted(
        make_model("cnn"),
        lambda step: make_batch("cnn", sizes[step], seed=step),
        loss_of,
        len(sizes),
        budget=budget,
        min_swap_bytes=0,
        reserve_bytes=0,
        policy=policy,
        momentum=0.9,
    )
    planned = [step for step in seen if step.predicted is not None]
    assert len(seen) == len(sizes) and len(planned) == len(sizes) - 1
    assert all(step.peak <= step.predicted for step in planned), planned


def test_a_shape_planned_from_another_under_autocast_counts_the_weight_copies_that_shape_found():
    """Under autocast a shape's profiling pass finds the weights' bfloat16 copies and counts them
    as model state from then on, taking them off its working memory. A later shape, run under a
    plan made from that profile (scaled to it, or another shape's reused), holds the same copies
    (the same weights cast, whatever the batch): its model state counts them before its own pass
    found them, or the plan's prediction is short of them (batch 34 under a plan scaled from
    batch 16: 30,992 B held, 30,241 predicted; batch 32 under batch 34's plan: 30,400 held,
    30,236 predicted). Every planned step's peak stays within its prediction (the ops' own
    tensors as the allocator, the optimizer's step and state counted)."""
    sizes = [16, 34, 34, 32]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 10))
    seen, _ = run_counted(
        model,
        lambda step: class_rows(step, sizes[step]),
        cross_entropy_of,
        len(sizes),
        autocast=True,
        momentum=0.9,
        counted_optimizer=True,
        budget=10**10,
        reserve_bytes=0,
        min_swap_bytes=0,
    )
    planned = [step for step in seen if step.predicted is not None]
    assert len(planned) == len(sizes) - 1, "one profiling pass: the other shapes are planned from it"
    assert all(step.peak <= step.predicted for step in planned), [(s.peak, s.predicted) for s in planned]
