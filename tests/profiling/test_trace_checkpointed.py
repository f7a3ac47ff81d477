"""A model that checkpoints its own blocks (``torch.utils.checkpoint``, as Hugging Face's gradient
checkpointing does) is traced: the forward its checkpoints run again in backward is rewritten as
the first was (the target's fused dropout and attention kernel, CUDA autocast's casts), so that
their check of the tensors saved holds, and the kernels it assumes are counted once; what that
forward saves in backward is not counted among the step's saves (the engine's hooks, like the
trace's, see the forward's)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step

WIDTH, HEADS, TOKENS = 32, 4, 16


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        return x + self.dropout(self.out(attended))


class _Model(nn.Module):
    def __init__(self, checkpointed: bool, reentrant: bool = False) -> None:
        super().__init__()
        self.checkpointed, self.reentrant = checkpointed, reentrant
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(_Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant) if self.checkpointed else block(x)
        return x


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_model_checkpointing_its_blocks_is_traced_with_the_kernels_of_its_forward(dtype):
    def trace(checkpointed: bool, reentrant: bool = False):
        return trace_step(
            lambda: _Model(checkpointed, reentrant),
            (2, TOKENS, WIDTH),
            tracker=LayerTracker(),
            dtype=dtype,
            gpu=get_gpu("h100"),
        )

    plain, checkpointed, reentrant = trace(False), trace(True), trace(True, reentrant=True)
    assert checkpointed.kernels == reentrant.kernels == plain.kernels
    assert ("dropout", "fused (bool mask)", 2) in plain.kernels
    # what the checkpoints save in forward: their inputs, not their blocks' activations; a
    # reentrant checkpoint's recomputation saves in backward, past the hooks that see the
    # forward's saves (the engine's, and so the trace's)
    assert 0 < checkpointed.saved_bytes == reentrant.saved_bytes < plain.saved_bytes
