"""A hooked pass (one that measures the working memory a plan is made from) lets a layer's copies
brought back go before the next layer's saves come back, as an unhooked pass does: otherwise it
holds both at once, more than the levels it measured count, and its own peak passes the
prediction of the plan made from it. CPU: the allocator is the ops' own tensors
(:class:`~lightning_accudnn.testing.OpBytesAllocator`)."""

import torch
from torch import nn

from tests.session.helpers import class_rows, cross_entropy_of, run_counted

SIZES = (16, 34, 34)  # the second shape is profiled at step 1, and step 2 runs the plan made from it


class _NormBranch(nn.Module):
    """``x + silu(layer_norm(x.detach()))``: the norm saves three storages (its input, mean and
    inverse deviation), the SiLU one, and a plan with no prefetch window brings the norm's back
    in backward right after the SiLU's."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.norm(x.detach()))


def test_a_plan_made_from_a_hooked_pass_predicts_the_next_pass_of_its_shape():
    """The meter holds a swapped save's copy brought back until the readings go to a layer further
    down (as a plan's level counts it), which they did at that layer's first read, after the
    engine had brought that save back and prefetched others. Here the SiLU's copy was still held
    while the norm's three came back: the hooked passes peaked above their levels, and the pass
    after the profiling one went 3.8 KB above the plan's prediction (fuzzed seed 21268: 8 bytes).
    The readings now go down before the save is brought back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), _NormBranch(32), nn.Linear(32, 32), nn.Linear(32, 10))
    seen, _ = run_counted(
        model,
        lambda step: class_rows(step, SIZES[step]),
        cross_entropy_of,
        len(SIZES),
        budget=33_000,
        reserve_bytes=0,
        min_swap_bytes=0,
        policy="swap",
    )
    last = seen[-1]
    assert last.predicted is not None and last.swapped > 0
    assert last.peak <= last.predicted
