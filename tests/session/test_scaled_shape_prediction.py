"""A batch shape planned from another's profile, scaled: the prediction bounds its peak.

A working memory figure is what the step held beyond the planner's level less the model state
the device did not hold then: the parameters' gradients before the backward makes them. The held
part grows with the batch, the part not held does not; scaling the whole figure by the batch
ratio left a larger batch's levels short by that ratio, less one, times the gradients not made.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_accudnn.planner import scale_profile
from tests.session.helpers import run_counted


class TokenClassifier(nn.Module):
    """Embedded tokens through two linear layers, pooled, classified."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, width)
        self.body = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)).mean(1))


def _model() -> TokenClassifier:
    torch.manual_seed(0)
    return TokenClassifier()


def _batches(sizes: list[int]):
    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(step)
        rows = sizes[step]
        return torch.randint(0, 50, (rows, 8), generator=generator), torch.randint(
            0, 10, (rows,), generator=generator
        )

    return batch


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, labels = batch
    return F.cross_entropy(model(tokens), labels)


def _steps(sizes: list[int], **config):
    """The steps of ``sizes`` (rows per batch), the optimizer's state and step counted by the
    allocator as CUDA's counts them."""
    return run_counted(
        _model(), _batches(sizes), _loss, len(sizes), momentum=0.9, counted_optimizer=True, **config
    )


@pytest.mark.parametrize("policy", ["swap", "auto"])
def test_twice_the_profiled_batch_planned_from_its_scaled_profile_peaks_within_the_prediction(policy):
    sizes = [8, 16]
    kept, _ = _steps(sizes, budget=10**10, policy=policy)
    budget = int(0.9 * max(step.peak for step in kept))
    seen, _ = _steps(sizes, budget=budget, policy=policy, min_swap_bytes=0, reserve_bytes=0)
    larger = seen[1]
    assert larger.predicted is not None, "the larger batch is planned from the smaller one's profile"
    assert larger.peak <= larger.predicted <= budget


def test_scaled_working_memory_bounds_what_the_larger_batch_measured_at_every_level():
    """Each layer's forward and backward working memory, and what the step held between the
    passes, scaled from batch 8 to 16, are at least what a pass of batch 16 measured."""
    profiles = []
    for rows in (8, 16):
        seen, _ = _steps([rows, rows], budget=10**10)
        profiles.append(seen[1].profile)
    small, large = profiles
    assert small.static_not_held_bytes > 0  # the gradients, made in the backward
    scaled = scale_profile(small, 2.0)
    assert scaled.outside_working_bytes >= large.outside_working_bytes
    for grown, measured in zip(scaled.layers, large.layers, strict=True):
        assert grown.forward_working_bytes >= measured.forward_working_bytes, grown.name
        assert grown.backward_working_bytes >= measured.backward_working_bytes, grown.name


def test_the_tuner_s_predictions_for_larger_batches_bound_their_peaks():
    """The tuner predicts each candidate batch size from one profile, scaled: batches 2 and 8
    times the profiled one, under a budget the larger must swap for, peak within their predictions."""
    from lightning_accudnn.callbacks.prediction import predict_batch_sizes
    from tests.models import SmallResNet, loss_of, make_batch

    def steps(rows: int, budget: int):
        torch.manual_seed(0)
        return run_counted(
            SmallResNet(),
            lambda step: make_batch("cnn", rows),
            loss_of,
            2,
            momentum=0.9,
            counted_optimizer=True,
            budget=budget,
            policy="swap",
            min_swap_bytes=0,
            reserve_bytes=0,
        )[0]

    budget = 9_000_000
    profile = steps(8, budget)[-1].profile
    predicted = predict_batch_sizes(profile, 8, None, [16, 64], budget)
    for rows in (16, 64):
        assert predicted[rows].feasible
        assert steps(rows, budget)[-1].peak <= predicted[rows].peak_bytes <= budget, rows
