"""A module's own code that saves a recomputed segment's output again after the segment: the
budget the first step names trains every later step of that shape.

``body`` runs functional ops of its own (they save), then two blocks (each a linear layer
and a custom autograd function that saves its result), then ``sin`` of the second block's
output, in its own code again. In the profiling pass that ``sin`` saves the block's stored
output again. Placed at the block's own layer (the latest to have saved), the re-save was
dropped: recomputing the block was taken to free its output, which ``sin`` still holds. At the
base a planned pass at the budget step 0 named (134.48 KB) passed it, the reserve grew by
2.60 KB, and the shape was refused (145.28 KB needed), after weight updates. Placed at the next
layer to save, with ``body`` noted as the module that saved it again, the output counts after
the block, and step 0 names what every step needs.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn.planner import BudgetTooSmallError
from tests.session.helpers import class_rows, cross_entropy_of, run_counted


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x.clamp(max=3))
        ctx.save_for_backward(y)
        ctx.mask = x <= 3
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad * y * ctx.mask


class _Block(nn.Module):
    def __init__(self, square: bool) -> None:
        super().__init__()
        self.square = square
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return _Square.apply(torch.tanh(y)) if self.square else _Exp.apply(y)


def _split(x: torch.Tensor) -> torch.Tensor:
    left, right = x.split([8, 24], -1)
    return torch.cat([torch.relu(left), torch.tanh(right)], -1)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([c * (i + 1) for i, c in enumerate(reversed(x.chunk(2, -1)))], -1)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.lin(_swap_halves(_split(x)))


class _Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(square=True), _Block(square=False)])
        self.residual = _Residual()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _swap_halves(_swap_halves(_split(x)))  # the body's own code saves
        x = self.blocks[1](self.blocks[0](x))
        x = torch.sin(x)  # and saves the second block's output again
        return torch.relu(self.residual(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), _Body(), nn.Linear(32, 10))


def _train(budget: int, steps: int):
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return run_counted(
        model,
        lambda step: class_rows(step, 64),
        cross_entropy_of,
        steps,
        optimizer=optimizer,
        counted_optimizer=True,
        budget=budget,
        min_swap_bytes=0,
        reserve_bytes=0,
        policy="recompute",
    )


def test_the_budget_named_at_the_first_step_trains_every_step_of_the_shape():
    try:
        _train(10_000, 1)
    except BudgetTooSmallError as refusal:
        named = refusal.min_budget_bytes
    else:
        raise AssertionError("a 10 KB budget was not refused")
    seen, plan = _train(named, 5)
    planned = [step for step in seen if step.predicted is not None]
    assert plan.recomputed and len(planned) == 4
    assert all(step.peak <= step.predicted <= named for step in planned), planned
    assert all(step.reserve == 0 for step in seen)
