"""Small random models built from pieces that break offloading engines."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

CHANNELS = 4


class Conv(nn.Module):
    """conv-BN-ReLU, optionally in channels_last."""

    def __init__(self, channels_last: bool) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(CHANNELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return torch.relu(self.bn(self.conv(x)))


class Branches(nn.Module):
    """One storage saved by several layers: ``x`` feeds two convolutions and a product."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.b = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) * torch.sigmoid(self.b(x)) + x * x


class OffsetViews(nn.Module):
    """Views with storage offsets saved by elementwise ops (a slice of channels, a transpose)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, CHANNELS - 1).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tail = x[:, 1:] * self.scale
        head = x[:, :1].transpose(2, 3).sin().transpose(2, 3)
        return torch.cat([head, tail], dim=1)


class GatesInPlace(nn.Module):
    """A GRU-style gate: ``unsafe_chunk`` parts written in place after one part was saved."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Conv2d(CHANNELS, 2 * CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.mix(x).unsafe_chunk(2, 1)
        gate = gate.sigmoid_()
        value = value.tanh_()
        return gate * value + x


class Bf16(nn.Module):
    """An island of bf16 arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, CHANNELS, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = x.bfloat16() * self.scale.bfloat16()
        return (low.sigmoid() * low).float()


class Gather(nn.Module):
    """An integer index tensor saved by ``gather``."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((1, CHANNELS, 1, 1), 0.9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = (x.detach().abs() * 7).long().remainder(CHANNELS)
        return torch.gather(x * self.scale, 1, index) + x


class Dropout(nn.Module):
    """Random numbers in forward: a recomputation must draw the same mask again."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.tanh(self.conv(x))) + x


class Shared(nn.Module):
    """One module called twice in a step (its weight saved by both calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.conv(torch.relu(self.conv(x)))) * x


class UserCheckpoint(nn.Module):
    """The model's own ``torch.utils.checkpoint``, whose hooks run inside the engine's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(CHANNELS, CHANNELS, 1)
        self.b = nn.Conv2d(CHANNELS, CHANNELS, 1)

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint(self._inner, x, use_reentrant=False)
        return out + x


class Tokens(nn.Module):
    """A transformer's layout: pixels as tokens through transposed views, LayerNorm, GELU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(CHANNELS)
        self.proj = nn.Linear(CHANNELS, CHANNELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        tokens = self.proj(F.gelu(self.norm(tokens)))
        return tokens.transpose(1, 2).reshape(n, c, h, w) + x


class MaxPoolIndices(nn.Module):
    """Max pooling, which saves its int64 indices beside its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled, _ = F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True)
        return pooled * 0.5 + x


PIECES = {
    "conv": lambda: Conv(channels_last=False),
    "conv_channels_last": lambda: Conv(channels_last=True),
    "branches": Branches,
    "offset_views": OffsetViews,
    "gates_in_place": GatesInPlace,
    "bf16": Bf16,
    "gather": Gather,
    "dropout": Dropout,
    "shared": Shared,
    "user_checkpoint": UserCheckpoint,
    "tokens": Tokens,
    "max_pool_indices": MaxPoolIndices,
}


class RandomNet(nn.Module):
    def __init__(self, pieces: list[str]) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, padding=1)
        self.body = nn.Sequential(*[PIECES[name]() for name in pieces])
        self.head = nn.Linear(CHANNELS, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)).mean(dim=(2, 3)))


def random_batch(seed: int, batch_size: int = 2, size: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch_size, 3, size, size, generator=generator),
        torch.randint(0, 5, (batch_size,), generator=generator),
    )
