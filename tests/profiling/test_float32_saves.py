"""What a mixed-precision step still saves in float32: per layer, against a real CPU step
counted independently, and as CUDA autocast's float32 ops make it on the GPU planned for.

(Batch norm's statistics are left out: under fake tensors they take the input's dtype, where
the CPU's and CUDA's kernels keep them in float32; a few bytes per channel.)"""

from __future__ import annotations

import pytest
import torch

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step
from tests.models import TinyGPT, transformer_encoder, upcasting_mlp
from tests.profiling.real_step import real_saved_by_layer


@pytest.mark.parametrize(
    ("factory", "batch"),
    [
        (upcasting_mlp, torch.zeros(8, 64)),
        (TinyGPT, torch.zeros(8, 16, dtype=torch.long)),
        (transformer_encoder, torch.zeros(4, 32, 64)),
    ],
    ids=["upcast", "gpt", "transformer"],
)
def test_float32_saves_per_layer_match_a_real_bf16_step_on_the_cpu(factory, batch) -> None:
    torch.manual_seed(0)
    real = real_saved_by_layer(factory(), batch, autocast=torch.bfloat16, only=torch.float32)
    trace = trace_step(
        factory, tuple(batch.shape), tracker=LayerTracker(), input_dtype=batch.dtype, dtype="bf16"
    )
    assert {layer.name: layer.float32_bytes for layer in trace.layers if layer.float32_bytes} == real
    assert 0 < trace.float32_saved_bytes == sum(real.values()) < trace.saved_bytes


def test_cuda_autocasts_float32_ops_save_float32_on_the_gpu_planned_for() -> None:
    # CUDA autocast runs exp in float32: exp saves its float32 result. The explicit upcast saves
    # its float32 input to square. The linear layers save 16-bit inputs (and weight copies).
    trace = trace_step(upcasting_mlp, (8, 64), tracker=LayerTracker(), dtype="bf16", gpu=get_gpu("h100"))
    activation = 8 * 64 * 4
    assert {layer.name: layer.float32_bytes for layer in trace.layers if layer.float32_bytes} == {
        "1": activation,
        "3": activation,
    }
    assert trace.float32_saved_by_kind() == (("1", activation, 1), ("3", activation, 1))
