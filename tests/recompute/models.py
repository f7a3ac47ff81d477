"""Models for the recompute tests: dropout, SDPA, a block the user already checkpoints."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_accudnn.ops.recomputation_scope import is_recomputing
from lightning_accudnn.planner.recompute import policy_spans
from lightning_accudnn.planner.search import MixedResult
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.profiling.bandwidth import LinkCurve
from lightning_accudnn.testing.forced_plans import forced_result
from tests.models import SmallResNet


class DropoutBlock(nn.Module):
    """Pre-norm transformer block with dropout after attention and in the MLP, SDPA attention."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.2)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(0.2), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(attended.transpose(1, 2).reshape(batch, length, dim)))
        return x + self.mlp(self.norm2(x))


class DropoutGPT(nn.Module):
    def __init__(self, vocab: int = 40, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[DropoutBlock(dim) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


class UserCheckpointed(nn.Module):
    """A stem, a block the model itself runs under checkpointing, two plain blocks, a head."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.checkpointed = nn.Sequential(
            nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh()
        )
        self.plain = nn.Sequential(*[_tanh_pair(width) for _ in range(2)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = checkpoint(self.checkpointed, x, use_reentrant=False)
        return self.head(self.plain(x))


class SlowRecomputation(nn.Module):
    """ReLU, pausing ``pause`` seconds while it is recomputed (a recomputation the host issues
    slowly)."""

    def __init__(self, pause: float) -> None:
        super().__init__()
        self.pause = pause

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_recomputing():
            time.sleep(self.pause)
        return torch.relu(x)


class ColdRecomputation(SlowRecomputation):
    """:class:`SlowRecomputation` in its first ``cold`` recomputations only (a first pass under a
    new plan, while the allocator grows), quick after."""

    def __init__(self, pause: float, cold: int) -> None:
        super().__init__(pause)
        self.cold = cold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_recomputing() and self.cold > 0:
            self.cold -= 1
            time.sleep(self.pause)
        return torch.relu(x)


def _tanh_pair(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return {
        "resnet": lambda: SmallResNet(channels=8, blocks=3),
        "gpt": DropoutGPT,
        "checkpointed": UserCheckpointed,
    }[kind]()


def batch(kind: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    if kind == "resnet":
        return torch.randn(8, 3, 12, 12, generator=generator), torch.randint(0, 10, (8,), generator=generator)
    if kind == "gpt":
        tokens = torch.randint(0, 40, (4, 17), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]
    return torch.randn(16, 64, generator=generator), torch.randint(0, 10, (16,), generator=generator)


def loss_of(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


#: A host link of about 1 KB/s each way: every copy costs seconds.
SLOW_LINK = LinkCurve((2**10, 2**30), d2h_seconds=(1.0, 2.0**20), h2d_seconds=(1.0, 2.0**20))


def slow_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions made from now on (in this test) measure :data:`SLOW_LINK` as their host link."""
    monkeypatch.setattr("lightning_accudnn.session.session.probe_host_link", lambda device: SLOW_LINK)


def forcing_search(names: tuple[str, ...], swapped: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    """A replacement for ``planner.plan.search_mixed`` that recomputes the segments ``names``
    (whole), swaps the layers ``swapped`` and keeps every other layer: the plan's choices,
    whatever the timings."""

    def search(
        profile: StepProfile, cap: int, max_limit: int | None = None, policy: str = "auto", host_fits=None
    ) -> MixedResult:
        spans = [span for span in policy_spans(profile, policy) if span.name in names]
        assert sorted(span.name for span in spans) == sorted(names), [span.name for span in spans]
        result = forced_result(profile, spans, (lambda layer: layer.name in swapped) if swapped else None)
        assert result.step is not None
        flags = result.best.choice.swap
        layers = [layer.name for layer in result.step.profile.layers[: len(flags)]]
        assert set(swapped) <= set(layers), layers  # each among the layers a plan may swap
        return result

    return search
