"""A model whose saved tensors are all below ``min_swap_bytes`` is told so when its budget is too small."""

import pytest
import torch
from torch import nn

from lightning_accudnn import BudgetTooSmallError, OffloadConfig, OffloadSession
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES


def test_the_error_says_the_smallest_budget_is_limited_by_min_swap_bytes():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(8)])
    batch = torch.randn(64, 256)  # every saved tensor is 64 KiB, far below the 1 MiB default
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    static = sum(p.numel() * p.element_size() for p in model.parameters()) * 2  # weights and grads
    session = OffloadSession(OffloadConfig(budget=static + 2**16), torch.device("cpu"))
    with pytest.raises(BudgetTooSmallError) as raised:
        with session.step(model, optimizer):
            loss = model(batch).sum()
        loss.backward()
    session.close()

    hint = raised.value.smaller_min_swap_bytes
    assert hint is not None, "the profile should carry the storages kept for being small"
    threshold, smaller = hint
    assert threshold < DEFAULT_MIN_SWAP_BYTES and smaller < raised.value.min_budget_bytes
    assert "min_swap_bytes" in str(raised.value)
