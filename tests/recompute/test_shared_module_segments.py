"""A module called both inside a container and outside it (a shared module) has all its layers
named under its first name, inside that container: the container is not a segment to recompute,
since recomputing it would not free the saves of the call outside it. Planned as one, the plans
made from the profiling pass counted those saves as freed, and a later pass, which saw them saved
outside the segment, re-planned above the minimum the first step had named and refused a shape
already trained. CPU: the allocator is the ops' own tensors."""

import pytest
import torch
from torch import nn

from lightning_accudnn.ops.recompute import SegmentProbe
from lightning_accudnn.planner import BudgetTooSmallError
from tests.session.helpers import run_counted

WIDTH = 32


class _ExpOut(torch.autograd.Function):
    """Saves its output only (and a mask outside ``save_for_backward``)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        y = torch.exp(x.clamp(max=3))
        ctx.save_for_backward(y)
        ctx.mask = x <= 3
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (y,) = ctx.saved_tensors
        return grad * y * ctx.mask


class _Exp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ExpOut.apply(self.lin(x))


class _Gate(nn.Module):
    """``x * sigmoid(inner(x))``, ``inner`` run without gradients."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = nn.Sequential(inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = self.inner(x)
        return x * torch.sigmoid(y)


class _Model(nn.Module):
    """The shared linear is first named ``gate.inner.0``; its second call runs outside ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        shared = nn.Linear(WIDTH, WIDTH)
        self.inp = nn.Linear(16, WIDTH)
        self.exp = _Exp()
        self.gate = _Gate(shared)
        self.shared = shared
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.shared(self.gate(self.exp(self.inp(x))))
        return self.head(h), h.square().mean()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return torch.randn(32, 16, generator=generator), torch.randint(0, 10, (32,), generator=generator)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    logits, aux = model(inputs)
    return nn.functional.cross_entropy(logits, targets) + 0.1 * aux


def test_a_container_of_a_module_also_called_outside_it_is_no_segment():
    """The probe leaves ``gate`` and ``gate.inner`` out of the segments and says why; ``exp``
    stays one."""
    model = _Model()
    probe = SegmentProbe()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        probe.attach(model)
        model(_batch(0)[0])
    probe.detach()
    assert [segment.name for segment in probe.segments()] == ["exp"]
    reason = "a module inside it is also called outside it"
    assert [(excluded.name, excluded.reason) for excluded in probe.excluded()] == [
        ("gate", reason),
        ("gate.inner", reason),
    ]


def test_the_minimum_named_at_the_first_step_trains_every_step():
    """Recompute policy at the budget the first step's refusal names: no later step is refused
    (fuzzed seed 21072: refused at step 2, 2.8% above the minimum named at step 0)."""
    with pytest.raises(BudgetTooSmallError) as refused:
        run_counted(
            _Model(), _batch, _loss, 1, budget=1_000, reserve_bytes=0, min_swap_bytes=0, policy="recompute"
        )
    minimum = refused.value.min_budget_bytes
    seen, _ = run_counted(
        _Model(), _batch, _loss, 4, budget=minimum, reserve_bytes=0, min_swap_bytes=0, policy="recompute"
    )
    assert len(seen) == 4
