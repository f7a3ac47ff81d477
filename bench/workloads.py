"""The benchmark workloads: a model, its synthetic batches, its loss and its optimizer.

Each workload is a function with size parameters returning a :class:`Workload`; every
strategy of a run builds its own fresh model from it under the same seed and trains on
the same batches, so the runs differ only in how activations are kept.

Example:
    >>> workload = tiny()
    >>> workload.depth_blocks, workload.batch_size
    (8, 16)
    >>> model = workload.build()
    >>> batch = workload.make_batch(0)
    >>> float(workload.loss(model, batch)) > 0
    True
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck, conv1x1

Batch = tuple[torch.Tensor, torch.Tensor]

#: ResNet-152's blocks per stage; a deep bottleneck ResNet spreads its blocks in these shares.
RESNET152_STAGES = (3, 8, 36, 3)


@dataclass(frozen=True)
class Workload:
    """One training step to benchmark: how to build the model, the data, the loss, the optimizer.

    ``make_batch(i)`` returns the ``i``-th synthetic batch on the CPU (the same for every
    strategy); ``blocks(model)`` names the modules that full activation checkpointing wraps
    one by one; ``samples`` is the number of samples in one batch. ``precision`` is
    ``"fp32"`` or ``"bf16"`` (autocast around forward and loss).

    Example:
        >>> workload = gpt(layers=2, d_model=64, heads=4, seq_len=32, vocab=128, batch_size=2)
        >>> workload.blocks(workload.build())
        ['blocks.0', 'blocks.1']
    """

    name: str
    params: dict[str, Any]
    batch_size: int
    precision: str
    build: Callable[[], nn.Module] = field(repr=False)
    make_batch: Callable[[int], Batch] = field(repr=False)
    loss: Callable[[nn.Module, Batch], torch.Tensor] = field(repr=False)
    blocks: Callable[[nn.Module], list[str]] = field(repr=False)
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] = field(repr=False)
    #: Blocks of a deep bottleneck ResNet (``None`` for other models).
    depth_blocks: int | None = None
    #: Suggested ``min_swap_bytes`` for AccUDNN (``None``: the strategy's default).
    min_swap_bytes: int | None = None

    @property
    def samples(self) -> int:
        return self.batch_size


def _check_precision(precision: str) -> str:
    if precision not in ("fp32", "bf16"):
        raise ValueError(f'precision must be "fp32" or "bf16", got {precision!r}')
    return precision


def _classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images).float(), labels)


def _image_batches(batch_size: int, image_size: int, classes: int) -> Callable[[int], Batch]:
    def make(index: int) -> Batch:
        generator = torch.Generator().manual_seed(1000 + index)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        return images, torch.randint(0, classes, (batch_size,), generator=generator)

    return make


def _modules_of_type(kind: type[nn.Module]) -> Callable[[nn.Module], list[str]]:
    def names(model: nn.Module) -> list[str]:
        return [name for name, module in model.named_modules() if isinstance(module, kind)]

    return names


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


# -- ResNet-152 -------------------------------------------------------------------------------


def resnet152(
    batch_size: int = 16, image_size: int = 224, precision: str = "bf16", base_width: int = 64
) -> Workload:
    """torchvision's ResNet-152 (1000 classes) on ``image_size`` images, SGD with momentum.

    ``base_width`` below 64 builds the same architecture narrower (:class:`DeepBottleneckResNet`
    with ResNet-152's 50 blocks): the module calls and saved tensors of ResNet-152 at sizes a
    CPU runs in seconds.

    Example:
        >>> resnet152(batch_size=2, image_size=64, precision="fp32").name
        'resnet152'
        >>> type(resnet152(base_width=4).build()).__name__
        'DeepBottleneckResNet'
    """
    from torchvision.models import resnet152 as build_resnet152

    def build() -> nn.Module:
        if base_width == 64:
            return build_resnet152(weights=None, num_classes=1000)
        return DeepBottleneckResNet(blocks_for_depth(152), base_width, classes=1000)

    params: dict[str, Any] = {"batch_size": batch_size, "image_size": image_size, "precision": precision}
    if base_width != 64:
        params["base_width"] = base_width
    return Workload(
        name="resnet152",
        params=params,
        batch_size=batch_size,
        precision=_check_precision(precision),
        build=build,
        make_batch=_image_batches(batch_size, image_size, 1000),
        loss=_classification_loss,
        blocks=_modules_of_type(Bottleneck),
        optimizer=_sgd,
    )


# -- GPT-style decoder ------------------------------------------------------------------------


class DecoderBlock(nn.Module):
    """Pre-norm decoder block: causal self-attention (SDPA) and a 4x GELU MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of heads ({heads})")
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, dim))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class GPTDecoder(nn.Module):
    """A GPT-2-style language model: token and position embeddings, decoder blocks, tied head."""

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*[DecoderBlock(d_model, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        return self.lm_head(self.norm(self.blocks(x)))


def gpt(
    layers: int = 24,
    d_model: int = 1024,
    heads: int = 16,
    seq_len: int = 1024,
    vocab: int = 50257,
    batch_size: int = 8,
    precision: str = "bf16",
) -> Workload:
    """A GPT-style decoder (GPT-2 medium shape by default), next-token loss, AdamW.

    Example:
        >>> workload = gpt(layers=1, d_model=32, heads=2, seq_len=8, vocab=50, batch_size=2)
        >>> tokens, targets = workload.make_batch(0)
        >>> tokens.shape, targets.shape
        (torch.Size([2, 8]), torch.Size([2, 8]))
    """

    def make(index: int) -> Batch:
        generator = torch.Generator().manual_seed(2000 + index)
        tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        tokens, targets = batch
        logits = model(tokens)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    return Workload(
        name="gpt",
        params={
            "layers": layers,
            "d_model": d_model,
            "heads": heads,
            "seq_len": seq_len,
            "vocab": vocab,
            "batch_size": batch_size,
            "precision": precision,
        },
        batch_size=batch_size,
        precision=_check_precision(precision),
        build=lambda: GPTDecoder(vocab, d_model, heads, layers, seq_len),
        make_batch=make,
        loss=loss,
        blocks=_modules_of_type(DecoderBlock),
        optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=3e-4),
    )


# -- ultra-deep bottleneck ResNet -------------------------------------------------------------


def stage_blocks(blocks: int) -> tuple[int, int, int, int]:
    """Spread ``blocks`` bottleneck blocks over four stages in ResNet-152's shares (3:8:36:3).

    Every stage gets at least one block; 50 blocks give exactly ResNet-152's stages.

    Example:
        >>> stage_blocks(50), stage_blocks(4), sum(stage_blocks(333))
        ((3, 8, 36, 3), (1, 1, 1, 1), 333)
    """
    if blocks < 4:
        raise ValueError(f"a bottleneck ResNet needs at least 4 blocks (depth 14), got {blocks}")
    total = sum(RESNET152_STAGES)
    shares = [blocks * share / total for share in RESNET152_STAGES]
    counts = [max(1, math.floor(share)) for share in shares]
    order = sorted(range(4), key=lambda i: shares[i] - math.floor(shares[i]), reverse=True)
    i = 0
    while sum(counts) < blocks:
        counts[order[i % 4]] += 1
        i += 1
    while sum(counts) > blocks:
        largest = max(range(4), key=lambda j: counts[j])
        counts[largest] -= 1
    return counts[0], counts[1], counts[2], counts[3]


def blocks_for_depth(depth: int) -> int:
    """Bottleneck blocks of a ResNet of ``depth`` layers (``depth = 3 * blocks + 2``).

    Example:
        >>> blocks_for_depth(152), blocks_for_depth(1001)
        (50, 333)
    """
    if (depth - 2) % 3 or depth < 14:
        raise ValueError(
            f"depth must be 3 * blocks + 2 with at least 4 blocks (14, 17, 20, ...), got {depth}"
        )
    return (depth - 2) // 3


class DeepBottleneckResNet(nn.Module):
    """torchvision's ``Bottleneck`` blocks stacked in four stages behind the ImageNet stem.

    ``base_width`` is the first stage's bottleneck width (64 in torchvision's ResNets; the
    stages use 1, 2, 4 and 8 times it, and blocks output 4 times their width). With 50
    blocks and ``base_width=64`` this is ResNet-152's architecture.
    """

    def __init__(self, blocks: int, base_width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = base_width
        self.conv1 = nn.Conv2d(3, base_width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages = stage_blocks(blocks)
        self.layer1 = self._stage(base_width, stages[0], stride=1)
        self.layer2 = self._stage(2 * base_width, stages[1], stride=2)
        self.layer3 = self._stage(4 * base_width, stages[2], stride=2)
        self.layer4 = self._stage(8 * base_width, stages[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8 * base_width * Bottleneck.expansion, classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, Bottleneck):
                nn.init.zeros_(module.bn3.weight)  # each block starts as the identity: trainable at any depth

    def _stage(self, planes: int, count: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(count - 1)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def deep_resnet(
    depth: int = 1001,
    batch_size: int = 16,
    image_size: int = 224,
    base_width: int = 64,
    classes: int = 1000,
    precision: str = "fp32",
) -> Workload:
    """An ultra-deep bottleneck ResNet of ``depth = 3 * blocks + 2`` layers, SGD with momentum.

    Example:
        >>> deep_resnet(depth=152, batch_size=2, image_size=32).depth_blocks
        50
    """
    blocks = blocks_for_depth(depth)
    return Workload(
        name="deep_resnet",
        params={
            "depth": depth,
            "blocks": blocks,
            "stages": list(stage_blocks(blocks)),
            "batch_size": batch_size,
            "image_size": image_size,
            "base_width": base_width,
            "classes": classes,
            "precision": precision,
        },
        batch_size=batch_size,
        precision=_check_precision(precision),
        build=lambda: DeepBottleneckResNet(blocks, base_width, classes),
        make_batch=_image_batches(batch_size, image_size, classes),
        loss=_classification_loss,
        blocks=_modules_of_type(Bottleneck),
        optimizer=_sgd,
        depth_blocks=blocks,
    )


def tiny(depth: int = 26, batch_size: int = 16, image_size: int = 64, base_width: int = 4) -> Workload:
    """The CI workload: a narrow 26-layer bottleneck ResNet on 64x64 images (seconds on a CPU).

    Activations dominate its memory (as in the real workloads), so budgets at a half, a
    third and a quarter of its peak can be planned. Its ``min_swap_bytes`` is 0: every
    saved tensor is small.

    Example:
        >>> tiny().params["stages"]
        [1, 1, 5, 1]
    """
    workload = deep_resnet(depth, batch_size, image_size, base_width, classes=10, precision="fp32")
    params = dict(workload.params)
    return Workload(
        name="tiny",
        params=params,
        batch_size=workload.batch_size,
        precision=workload.precision,
        build=workload.build,
        make_batch=workload.make_batch,
        loss=workload.loss,
        blocks=workload.blocks,
        optimizer=workload.optimizer,
        depth_blocks=workload.depth_blocks,
        min_swap_bytes=0,
    )


#: Workload functions by name (``--workload`` of ``python -m bench.run``).
WORKLOADS: dict[str, Callable[..., Workload]] = {
    "resnet152": resnet152,
    "gpt": gpt,
    "deep_resnet": deep_resnet,
    "tiny": tiny,
}


def make_workload(name: str, **overrides: Any) -> Workload:
    """Build the named workload, converting string overrides to the parameter's type.

    Example:
        >>> workload = make_workload("gpt", layers="2", d_model="64", heads="4", seq_len="16", vocab="64")
        >>> workload.params["layers"]
        2
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    function = WORKLOADS[name]
    signature = inspect.signature(function)
    arguments: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in signature.parameters:
            raise ValueError(
                f"workload {name!r} has no parameter {key!r}; it takes {list(signature.parameters)}"
            )
        default = signature.parameters[key].default
        arguments[key] = type(default)(value) if isinstance(value, str) and default is not None else value
    return function(**arguments)
