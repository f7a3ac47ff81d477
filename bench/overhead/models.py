"""The models the host-overhead benchmark trains, each as a :class:`~bench.workloads.Workload`.

Micro models isolate one cost each; all start with one ``Linear`` so that the rest of the
graph requires grad:

* :func:`adds`: ``units`` modules that add a constant (a module call that saves no tensor);
* :func:`tanhs`: ``units`` ``Tanh`` modules (a module call that saves one tensor, its output);
* :func:`unused_parameters`: one ``Linear`` and ``count`` scalar parameters that forward
  does not use (what a walk over the parameters costs, and nothing else).

:func:`deep_narrow` is the 333 x Linear/LayerNorm/ReLU model at batch 4 of the overhead benchmark; the
tiny ResNet-152 and GPT-2-medium models have the real models' module structure (and so
their module calls and saved tensors per step) at widths and inputs that run in
milliseconds on a CPU. :func:`gpt2_medium` builds the real-size decoder for the planner.

Example:
    >>> workload = tanhs(units=3)
    >>> count_step(workload)
    StepCounts(module_calls=5, saved_tensors=6, parameters=2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.workloads import Batch, GPTDecoder, Workload, deep_resnet, gpt


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01)


def _regression_batch(batch_size: int, width: int) -> Batch:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, width, generator=generator), torch.randn(
        batch_size, width, generator=generator
    )


def _mse(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


def _regression(name: str, params: dict, build, batch_size: int, width: int) -> Workload:  # type: ignore[no-untyped-def]
    return Workload(
        name=name,
        params=params,
        batch_size=batch_size,
        precision="fp32",
        build=build,
        make_batch=lambda index: _regression_batch(batch_size, width),
        loss=_mse,
        blocks=lambda model: [],
        optimizer=_sgd,
    )


class AddConstant(nn.Module):
    """``x + 1``: a module call whose autograd node saves no tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1.0


class UnusedParameters(nn.Module):
    """A ``Linear`` and ``count`` scalar parameters that forward never reads."""

    def __init__(self, width: int, count: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.unused = nn.ParameterList(nn.Parameter(torch.zeros(())) for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def adds(units: int = 1000, width: int = 16, batch_size: int = 4) -> Workload:
    """One ``Linear`` then ``units`` :class:`AddConstant` modules (module calls, no saved tensors)."""
    return _regression(
        "adds",
        {"units": units, "width": width, "batch_size": batch_size},
        lambda: nn.Sequential(nn.Linear(width, width), *(AddConstant() for _ in range(units))),
        batch_size,
        width,
    )


def tanhs(units: int = 1000, width: int = 16, batch_size: int = 4) -> Workload:
    """One ``Linear`` then ``units`` ``Tanh`` modules (each saves its output: one saved tensor)."""
    return _regression(
        "tanhs",
        {"units": units, "width": width, "batch_size": batch_size},
        lambda: nn.Sequential(nn.Linear(width, width), *(nn.Tanh() for _ in range(units))),
        batch_size,
        width,
    )


def unused_parameters(count: int = 2000, width: int = 16, batch_size: int = 4) -> Workload:
    """One ``Linear`` and ``count`` scalar parameters forward does not use."""
    return _regression(
        "unused_parameters",
        {"count": count, "width": width, "batch_size": batch_size},
        lambda: UnusedParameters(width, count),
        batch_size,
        width,
    )


def deep_narrow(layers: int = 333, width: int = 64, batch_size: int = 4) -> Workload:
    """``layers`` x (``Linear``, ``LayerNorm``, ``ReLU``) of ``width`` features at ``batch_size``."""

    def build() -> nn.Module:
        modules: list[nn.Module] = []
        for _ in range(layers):
            modules += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
        return nn.Sequential(*modules)

    return _regression(
        "deep_narrow", {"layers": layers, "width": width, "batch_size": batch_size}, build, batch_size, width
    )


def tiny_resnet152(
    depth: int = 152, image_size: int = 32, base_width: int = 4, batch_size: int = 2
) -> Workload:
    """ResNet-152's structure (50 bottleneck blocks in 3:8:36:3 stages) at tiny width and resolution."""
    return deep_resnet(depth, batch_size, image_size, base_width, classes=10, precision="fp32")


def tiny_gpt2_medium(
    layers: int = 24,
    d_model: int = 32,
    heads: int = 16,
    seq_len: int = 16,
    vocab: int = 64,
    batch_size: int = 2,
) -> Workload:
    """GPT-2 medium's structure (24 decoder blocks, 16 heads) at tiny width, sequence and vocabulary."""
    return gpt(layers, d_model, heads, seq_len, vocab, batch_size, precision="fp32")


def gpt2_medium() -> nn.Module:
    """The real-size GPT-2 medium decoder (for ``python -m lightning_accudnn plan``; never built on CPU here).

    Example:
        >>> from lightning_accudnn.cli import resolve_model
        >>> resolve_model("bench.overhead.models:gpt2_medium").name
        'bench.overhead.models:gpt2_medium'
    """
    return GPTDecoder(vocab=50257, d_model=1024, heads=16, layers=24, seq_len=1024)


def gpt2_medium_two_blocks() -> nn.Module:
    """GPT-2 medium's widths with 2 of its 24 blocks: the ``--quick`` run's planner target (traces fast)."""
    return GPTDecoder(vocab=50257, d_model=1024, heads=16, layers=2, seq_len=1024)


@dataclass(frozen=True)
class StepCounts:
    """Per step: module calls (forward), tensors autograd saves (all of them), parameters."""

    module_calls: int
    saved_tensors: int
    parameters: int


def count_step(workload: Workload) -> StepCounts:
    """Count one forward and loss of a fresh model: module calls and every tensor autograd saves.

    Every module's forward pre-hook counts a call; a bare ``saved_tensors_hooks`` pair counts
    what autograd saves (parameters and views of them included, before any filter).
    """
    torch.manual_seed(0)
    model = workload.build()
    calls = saved = 0

    def count_call(module: nn.Module, args: object) -> None:
        nonlocal calls
        calls += 1

    def count_saved(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return tensor

    handles = [module.register_forward_pre_hook(count_call) for module in model.modules()]
    try:
        with torch.autograd.graph.saved_tensors_hooks(count_saved, lambda tensor: tensor):
            workload.loss(model, workload.make_batch(0))
    finally:
        for handle in handles:
            handle.remove()
    return StepCounts(calls, saved, sum(1 for _ in model.parameters()))
