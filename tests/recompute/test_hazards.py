"""Each way a recomputation can replay something other than the call, handled by construction.

A list the caller appends to after the call and a tensor passed twice are replayed as they
were (the arguments are recorded at the call); a segment that changes module state, an
argument object (a cache), or whose input is written in place after the call, is excluded
in profiling with its reason; tied weights need nothing. Each test trains at the least budget
that recomputation names, so the planner recomputes every segment it may.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.recompute.sweep import Workload, check_model, least_recompute_budget, plain_record
from tests.recompute.zoo import CLASSES


class DenseLayer(nn.Module):
    """DenseNet's layer: the concatenation of a list of feature maps, normalised and convolved."""

    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.conv = nn.Conv2d(channels, growth, 3, padding=1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.conv(F.relu(self.norm(torch.cat(features, 1))))


class DenseBlock(nn.Module):
    """Passes each layer the list of the feature maps so far, and appends to it after the call."""

    def __init__(self, channels: int = 4, growth: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.dense = nn.ModuleList(DenseLayer(channels + i * growth, growth) for i in range(layers))
        self.head = nn.Linear(channels + layers * growth, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.dense:
            features.append(layer(features))
        return self.head(torch.cat(features, 1).mean(dim=(2, 3)))


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` called as ``attention(x, x, x)``: it takes its packed in-projection
    only when query, key and value are one tensor."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.attention(x, x, x, need_weights=False)[0]


class Counting(nn.Module):
    """Counts its calls and scales by the count: a per-call side effect."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(self.linear(x)) * self.calls


class Cache:
    """A key/value cache passed as an argument: each call appends to it."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class Cached(nn.Module):
    """Attends over everything the cache holds, its own keys appended first."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.key = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, *, cache: Cache) -> torch.Tensor:
        cache.keys.append(self.key(x))
        keys = torch.cat(cache.keys, 1)
        return torch.softmax(x @ keys.transpose(1, 2), -1) @ keys


class Halves(nn.Module):
    """Returns ``tanh(x + bias)`` and a view of its input (which its caller then scales in place)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Identity())
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.inner(x) + self.bias), x[..., : x.shape[-1] // 2]


class Sequence(nn.Module):
    """Tokens through an embedding, a stem (a segment any plan may recompute), ``kind``'s
    blocks, then a head."""

    def __init__(self, kind: str, dim: int = 16, vocab: int = 20) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(vocab, dim)
        self.stem = nn.Sequential(nn.Linear(dim, dim), nn.Tanh())
        block = {"attention": SelfAttention, "counting": Counting, "cached": Cached, "halves": Halves}[kind]
        self.blocks = nn.ModuleList(block(dim) for _ in range(2))
        self.head = nn.Linear(dim, vocab)
        if kind == "attention":
            self.head.weight = self.embed.weight  # tied weights

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.stem(self.embed(tokens))
        cache = Cache()
        for block in self.blocks:
            if self.kind == "cached":
                x = x + block(x, cache=cache)
            elif self.kind == "halves":
                out, half = block(torch.sin(x))
                half.mul_(2)  # writes the block's input, through its output, after the call
                x = x + out
            else:
                x = x + block(x)
        return self.head(x)


def _sequence(kind: str) -> Workload:
    def batch(step: int) -> torch.Tensor:
        return torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(step))

    def loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens)
        return F.cross_entropy(logits[:, :-1].reshape(-1, 20), tokens[:, 1:].reshape(-1))

    return Workload(lambda: Sequence(kind), batch, loss)


def _dense() -> Workload:
    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(step)
        return torch.randn(2, 4, 6, 6, generator=generator), torch.randint(
            0, CLASSES, (2,), generator=generator
        )

    return Workload(DenseBlock, batch, lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]))


def _train_at_least_budget(workload: Workload) -> tuple[tuple[str, ...], dict[str, str]]:
    expected = plain_record(workload)
    outcome = check_model(workload, "recompute", least_recompute_budget(workload), expected)
    excluded = {entry.name: entry.reason for entry in outcome.plan.profile.excluded_segments}
    return outcome.plan.recomputed, excluded


def test_a_list_appended_to_after_the_call_is_replayed_as_it_was() -> None:
    recomputed, excluded = _train_at_least_budget(_dense())
    assert any(name.startswith("dense.") for name in recomputed) and not excluded


def test_one_tensor_passed_as_query_key_and_value_is_replayed_as_one_tensor_with_tied_weights() -> None:
    recomputed, excluded = _train_at_least_budget(_sequence("attention"))
    assert any(name.startswith("blocks.") for name in recomputed) and not excluded


def test_a_module_that_changes_its_state_per_call_is_not_recomputed() -> None:
    recomputed, excluded = _train_at_least_budget(_sequence("counting"))
    assert excluded.keys() == {"blocks.0", "blocks.1"} and not any(
        name.startswith("blocks.") for name in recomputed
    )
    assert excluded["blocks.0"] == "calling it changes Counting.calls"


def test_a_segment_that_updates_an_argument_object_is_not_recomputed() -> None:
    recomputed, excluded = _train_at_least_budget(_sequence("cached"))
    assert excluded.keys() == {"blocks.0", "blocks.1"} and not any(
        name.startswith("blocks.") for name in recomputed
    )
    assert "argument 'cache' (Cache)" in excluded["blocks.0"]


def test_a_segment_whose_input_is_written_through_its_output_after_the_call_is_not_recomputed() -> None:
    recomputed, excluded = _train_at_least_budget(_sequence("halves"))
    assert {"blocks.0", "blocks.1"} <= excluded.keys()
    assert not any(name.startswith("blocks.") for name in recomputed)
    assert "written in place after the call" in excluded["blocks.0"]
