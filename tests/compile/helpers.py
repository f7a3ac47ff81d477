"""Tiny regionally compiled models, their training loops, and Dynamo's compile counts."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.ops.compiled_blocks import compiled_in_place, wrap_compiled_call
from lightning_accudnn.planner.plan import min_budget_bytes
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session import OffloadConfig, OffloadSession

WIDTH, INPUTS, CLASSES, BATCH = 32, 16, 4, 64
BACKENDS = ("aot_eager", "inductor")
FORMS = ("block.compile()", "torch.compile(block)")


class Block(nn.Module):
    """A residual MLP block: the unit compiled on its own."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class NormDropoutBlock(nn.Module):
    """A residual MLP block with BatchNorm (running statistics) and dropout (random numbers)."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.norm = nn.BatchNorm1d(2 * width)
        self.drop = nn.Dropout(0.3)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.drop(F.gelu(self.norm(self.up(x)))))


class Net(nn.Module):
    def __init__(self, blocks: int = 2, block: Callable[[], nn.Module] = Block) -> None:
        super().__init__()
        self.stem = nn.Linear(INPUTS, WIDTH)
        self.blocks = nn.ModuleList(block() for _ in range(blocks))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def compile_blocks(model: Net, backend: str, form: str) -> Net:
    """Compile each of ``model.blocks`` on its own, in ``form`` (one of :data:`FORMS`)."""
    for index, block in enumerate(model.blocks):
        if form == "block.compile()":
            block.compile(backend=backend)
        else:
            model.blocks[index] = torch.compile(block, backend=backend)
    return model


def compiled_net(backend: str, form: str, seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return compile_blocks(Net(), backend, form)


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(BATCH, INPUTS, generator=generator),
            torch.randint(0, CLASSES, (BATCH,), generator=generator),
        )
        for _ in range(steps)
    ]


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of every training loop here."""
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_plain(model: nn.Module, steps: int) -> list[list[torch.Tensor]]:
    optimizer = sgd(model)
    grads = []
    for batch in batches(steps):
        optimizer.zero_grad()
        loss_of(model, batch).backward()
        grads.append(grads_of(model))
        optimizer.step()
    return grads


def train_in(
    session: OffloadSession,
    model: nn.Module,
    steps: int,
    called: nn.Module | None = None,
    after_backward: Callable[[], None] | None = None,
) -> list[list[torch.Tensor]]:
    """``steps`` steps of ``model`` inside ``session``, called through ``called`` (its
    ``torch.compile`` wrapper; default the model itself), ``after_backward`` run after each
    backward: the gradients of every step."""
    called = model if called is None else called
    optimizer = sgd(model)
    grads = []
    for batch in batches(steps):
        optimizer.zero_grad()
        with session.step(called, optimizer):
            loss = loss_of(called, batch)
        loss.backward()
        grads.append(grads_of(model))
        if after_backward is not None:
            after_backward()
        optimizer.step()
    return grads


def assert_bitwise_equal(expected: list[list[torch.Tensor]], actual: list[list[torch.Tensor]]) -> None:
    assert len(expected) == len(actual)
    for step, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert len(want) == len(got) > 0
        for index, (a, b) in enumerate(zip(want, got, strict=True)):
            assert torch.equal(a, b), f"step {step}: gradient of parameter {index} differs"


def tight_budget(model: nn.Module) -> int:
    """A budget a quarter of the way from the smallest that works to the one that keeps every
    activation ``model`` saves in one step (with SGD momentum): a plan under it must swap."""
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = loss_of(model, batches(1)[0])
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    model.zero_grad(set_to_none=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    profile = StepProfile(stats.layers, static_bytes=model_state_bytes(model, [optimizer]))
    smallest = min_budget_bytes(profile)
    return smallest + (profile.unconstrained_peak_bytes - smallest) // 4


def recompute_budget(model: nn.Module) -> int:
    """The least budget policy ``"recompute"`` plans ``model`` at (with SGD momentum), from the
    profile a session made of it: below keeping everything, so a plan under it must recompute."""
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="recompute")
    session = OffloadSession(config, "cpu", report=lambda line: None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for batch in batches(2):
        optimizer.zero_grad()
        with session.step(model, optimizer):
            loss = loss_of(model, batch)
        loss.backward()
        optimizer.step()
    session.close()
    assert session.plan is not None
    profile = session.plan.profile
    budget = min_budget_bytes(profile, policy="recompute")
    assert budget < profile.unconstrained_peak_bytes
    return budget


@dataclass(frozen=True)
class CompileCounts:
    """What Dynamo compiled while a block of code ran."""

    frames: int  # Python frames Dynamo compiled (a recompile, after a guard failed, is one more)
    graphs: int  # FX graphs compiled (a graph break splits a frame into more than one)
    graph_breaks: int
    recompiles: int = 0  # compiles of a frame compiled before (Dynamo gave a recompile reason)

    @classmethod
    def during(cls, run: Callable[[], object]) -> CompileCounts:
        counters.clear()
        clear_compilation_metrics()
        run()
        return cls(
            frames=counters["frames"]["ok"],
            graphs=counters["stats"]["unique_graphs"],
            graph_breaks=sum(counters["graph_break"].values()),
            recompiles=sum(metric.recompile_reason is not None for metric in get_compilation_metrics()),
        )


def count_compiled_calls(block: nn.Module) -> list[int]:
    """A one-element counter of the runs of ``block``'s compiled code, observed from outside it
    (as the engine observes it): a block recomputed in backward runs twice per step."""
    runs = [0]

    def counted(call: Callable[..., object], *args: object, **kwargs: object) -> object:
        runs[0] += 1
        return call(*args, **kwargs)

    if compiled_in_place(block):
        wrap_compiled_call(block, counted)
    else:  # a torch.compile(block) wrapper: its forward runs the compiled code
        forward = block.forward
        block.forward = lambda *args, **kwargs: counted(forward, *args, **kwargs)
    return runs


def cpp_compiler_missing() -> str | None:
    """Why Inductor cannot build CPU kernels here, or ``None`` when a C++ compiler works."""
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        return "Inductor on CPU needs a C++ compiler (g++ or clang++), none on PATH"
    probe = subprocess.run([compiler, "--version"], capture_output=True, check=False)
    return (
        None if probe.returncode == 0 else f"{compiler} --version failed: Inductor cannot build CPU kernels"
    )


def backend_param(backend: str, *values: str) -> object:
    """``backend`` (then ``values``, a test's other parameters) as a pytest parameter, skipped
    with the reason when Inductor cannot run here."""
    reason = cpp_compiler_missing() if backend == "inductor" else None
    marks = [pytest.mark.skipif(reason is not None, reason=reason or "")]
    return pytest.param(backend, *values, marks=marks, id="-".join((backend, *values)))
