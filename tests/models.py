"""Small models with the shapes that break offloading engines: residuals, BatchNorm,
in-place ops, views, attention, weight transposes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class ResidualBlock(nn.Module):
    """conv-BN-ReLU(in place)-conv-BN, identity add, in-place ReLU (one ReLU module called twice)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


class SmallResNet(nn.Module):
    def __init__(self, channels: int = 16, blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.blocks = nn.Sequential(*[ResidualBlock(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(x))
        return self.head(features.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    """Pre-norm block with fused QKV (views via chunk/transpose) and scaled_dot_product_attention."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.norm2(x))


class SelfAttention(nn.Module):
    """One attention layer: fused QKV projection, ``scaled_dot_product_attention`` in a module of
    its own (``attention``, saving only what the attention kernel saves), output projection."""

    def __init__(self, dim: int = 256, heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attention = Attention(heads, dropout)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.attention(self.qkv(x)))


class Attention(nn.Module):
    """Causal attention of a fused ``(batch, length, 3 x dim)`` projection, heads as views."""

    def __init__(self, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        batch, length, dim = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        q, k, v = (
            t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)
            for t in qkv.split(dim, dim=-1)
        )
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)
        return attended.transpose(1, 2).reshape(batch, length, dim)


def self_attention_with_dropout() -> nn.Module:
    """:class:`SelfAttention` with attention dropout 0.1 (a factory for ``accudnn plan``)."""
    return SelfAttention(dropout=0.1)


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 64, layers: int = 2, length: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(length, dim))
        self.blocks = nn.Sequential(*[TransformerBlock(dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied weights

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.lm_head(self.norm(self.blocks(x)))


class _Upcast(nn.Module):
    """Explicit float32 arithmetic inside a 16-bit step (as RMSNorm implementations do)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().square()


class _Exp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)


def upcasting_mlp() -> nn.Module:
    """Linear layers (64 features) around an explicit float32 upcast (``1``) and an ``exp``
    (``3``), which CUDA autocast runs in float32: what a 16-bit step still saves in float32."""
    return nn.Sequential(nn.Linear(64, 64), _Upcast(), nn.Linear(64, 64), _Exp(), nn.Linear(64, 1))


def transformer_encoder() -> nn.Module:
    """Two ``nn.TransformerEncoderLayer`` (width 64, 4 heads, no dropout, batch first)."""
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def bottleneck_net(channels: int = 16, strides: tuple[int, ...] = (1, 2, 1, 2, 1)) -> nn.Module:
    """torchvision's Bottleneck blocks, narrow: a block's input is saved by the block before
    it, by its first convolution and by its downsample, and needed first by the downsample."""
    from torchvision.models.resnet import Bottleneck, conv1x1

    blocks, inplanes, planes = [], channels, channels // 2
    for stride in strides:
        downsample = None
        if stride != 1 or inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                conv1x1(inplanes, planes * Bottleneck.expansion, stride),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        blocks.append(Bottleneck(inplanes, planes, stride, downsample))
        inplanes = planes * Bottleneck.expansion
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(inplace=True),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(inplanes, 10),
    )


def make_batch(kind: str, batch_size: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return torch.randn(batch_size, 64, generator=generator), torch.randint(
            0, 10, (batch_size,), generator=generator
        )
    if kind in ("cnn", "bottleneck"):
        return (
            torch.randn(batch_size, 3, 16, 16, generator=generator),
            torch.randint(0, 10, (batch_size,), generator=generator),
        )
    tokens = torch.randint(0, 50, (batch_size, 17), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def make_model(kind: str) -> nn.Module:
    return {"mlp": MLP, "cnn": SmallResNet, "gpt": TinyGPT, "bottleneck": bottleneck_net}[kind]()


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Classifier(LightningModule):
    """A LightningModule around any of the models above, trained with SGD and momentum."""

    def __init__(self, kind: str = "cnn", lr: float = 0.05) -> None:
        super().__init__()
        self.model = make_model(kind)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return loss_of(self.model, batch)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", loss_of(self.model, batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def loader(kind: str, batches: int = 4, batch_size: int = 8) -> torch.utils.data.DataLoader:
    pairs = [make_batch(kind, batch_size, seed=i) for i in range(batches)]
    inputs = torch.cat([p[0] for p in pairs])
    targets = torch.cat([p[1] for p in pairs])
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
