"""Recompute plans predict the memory the engine's ledger then measures, in live CPU training.

For real models trained under policy ``"recompute"`` (keep or recompute), at the smallest budget
(most segments recomputed) and between it and the unconstrained peak (a part recomputed), the
plan's predicted ledger peak is never below the ledger's peak of any pass run under that plan, and
its activation part (the peak less the model state) is at most 10 % above the ledger's. The
ledger never sees what a recomputed segment saves while its backward runs (those saves go to the
checkpoint); the predicted peak adds them on top.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.planner.plan import Plan, min_budget_bytes
from lightning_accudnn.planner.recompute import candidate_spans
from lightning_accudnn.profile import StepProfile
from tests.recompute.models import DropoutGPT

#: The activation part of a prediction is at most this much above the ledger's.
TOLERANCE = 1.10


def _resnet18() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return torchvision.models.resnet18(num_classes=10), torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))


def _resnet50() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return torchvision.models.resnet50(num_classes=10), torch.randn(8, 3, 96, 96), torch.randint(0, 10, (8,))


class _DenseLayer(nn.Module):
    """BN-ReLU-conv1x1-BN-ReLU-conv3x3, its new features concatenated to its input."""

    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * growth, 1, bias=False),
            nn.BatchNorm2d(2 * growth),
            nn.ReLU(),
            nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], dim=1)


def _densenet() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A DenseNet-like model: every layer's input is all earlier features, concatenated."""
    growth, channels, stages = 8, 16, []
    for stage in range(3):
        layers = []
        for _ in range(3):
            layers.append(_DenseLayer(channels, growth))
            channels += growth
        stages.append(nn.Sequential(*layers))
        if stage < 2:
            stages.append(
                nn.Sequential(
                    nn.BatchNorm2d(channels), nn.Conv2d(channels, channels // 2, 1), nn.AvgPool2d(2)
                )
            )
            channels //= 2
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        *stages,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(channels, 10),
    )
    return model, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))


def _gpt() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 40, (4, 65), generator=torch.Generator().manual_seed(0))
    return DropoutGPT(dim=64, layers=4), tokens[:, :-1], tokens[:, 1:]


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]]] = {
    "resnet18": _resnet18,
    "resnet50": _resnet50,
    "densenet": _densenet,
    "gpt": _gpt,
}


def _train(kind: str, budget: int, steps: int) -> tuple[list[tuple[Plan | None, int]], OffloadSession]:
    """Per pass (the plan it ran under, None when profiling; the ledger's peak), and the session
    (closed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(
            OffloadConfig(budget=budget, min_swap_bytes=0, reserve_bytes=0, policy="recompute"), "cpu"
        )
    torch.manual_seed(0)
    model, inputs, targets = MODELS[kind]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    peaks: list[tuple[Plan | None, int]] = []
    for _ in range(steps):
        with session.step(model, optimizer):
            logits = model(inputs)
            running = session.plan if session.stats is not None else None  # the plan this pass runs
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        assert session.stats is not None
        assert (running is None) == session.stats.profiling
        peaks.append((running, session.stats.ledger_peak_bytes))
    session.close()
    return peaks, session


def _profile(kind: str) -> StepProfile:
    _, session = _train(kind, 10**10, 2)
    assert session.plan is not None
    return session.plan.profile


def _check(kind: str, budget: int) -> tuple[str, ...]:
    """Every pass run under a plan that recomputes: the ledger within its prediction."""
    peaks, session = _train(kind, budget, 4)
    checked = 0
    for plan, measured in peaks:
        if plan is None or not plan.recomputed:
            continue
        static = plan.profile.static_bytes
        predicted = plan.predicted_ledger_peak_bytes
        assert measured <= predicted <= plan.predicted_peak_bytes <= budget, (kind, measured, predicted)
        assert predicted - static <= TOLERANCE * (measured - static), (kind, measured, predicted, static)
        checked += 1
    assert checked, peaks
    assert session.plan is not None
    return session.plan.recomputed


CASES = [
    "resnet18",
    pytest.param("resnet50", marks=pytest.mark.slow),
    "densenet",
    "gpt",
]


@pytest.mark.parametrize("kind", CASES)
def test_recompute_plans_predict_the_ledger(kind):
    profile = _profile(kind)
    candidates = {span.name for span in candidate_spans(profile)}
    smallest = min_budget_bytes(profile, policy="recompute")
    assert smallest < profile.unconstrained_peak_bytes
    most = _check(kind, smallest)
    part = _check(kind, smallest + (profile.unconstrained_peak_bytes - smallest) * 3 // 5)
    assert len(part) <= len(most) <= len(candidates), (part, most)
