"""Under policy ``"selective"``, the budget the first step's refusal names trains every later
step of that batch shape, each within the peak predicted for it.

A segment recomputed selectively after an attention block (a convolution and its batch norm)
holds its inputs: the output of the block's projection. The attention block's own output, which
the projection saves again, is listed under the segment's first layer, and was taken for those
inputs, saved already: the plans counted the segment 4 KB short, the pass under them departed
from them, and the plan made from that pass's measurements needed more than the budget named,
which was refused at step 1, after the first update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_accudnn.planner import BudgetTooSmallError
from tests.session.helpers import run_counted


@pytest.fixture(autouse=True)
def one_thread():
    """A tiny model: one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = self.qkv(x.reshape(b, 4, 8)).chunk(3, dim=-1)
        q, k, v = (t.view(b, 4, 2, 4).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, 4, 8)).reshape(b, 32)


class _ConvNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        return self.bn(self.conv(x.view(b, 2, 4, 4))).permute(0, 2, 3, 1).reshape(b, 32)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.body = nn.Sequential(_Attention(), _ConvNorm())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(self.inp(x))
        return {"logits": self.head(h), "aux": h.square().mean()}


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return torch.randn(32, 16, generator=generator), torch.randint(0, 10, (32,), generator=generator)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    out = model(x)
    return F.cross_entropy(out["logits"], y) + 0.1 * out["aux"]


def _train(budget: int, steps: int):
    torch.manual_seed(0)
    return run_counted(
        _Model(),
        _batch,
        _loss,
        steps,
        momentum=0.9,
        budget=budget,
        reserve_bytes=0,
        min_swap_bytes=0,
        policy="selective",
    )


def test_the_budget_named_at_the_first_step_trains_every_later_step_of_its_shape():
    """The refusal names the least budget before any update; at it, the profiling pass, the plan
    made from it and the plans refined from the passes under them all plan (no refusal at a
    later step of the same shape), keep the reserve at 0 (no pass past the budget), recompute
    selectively, and peak within their predictions."""
    with pytest.raises(BudgetTooSmallError) as refused:
        _train(10_000, 1)
    named = refused.value.min_budget_bytes
    seen, plan = _train(named, 5)
    planned = [step for step in seen if step.predicted is not None]
    assert len(planned) == 4
    assert all(step.reserve == 0 for step in seen), "a pass went past the budget named"
    assert all(step.peak <= step.predicted <= named for step in planned), [
        (step.peak, step.predicted) for step in planned
    ]
    assert plan.selective, "the test needs a plan that recomputes selectively"
