"""The trace saves what the target GPU's attention kernel saves, and says which kernel it assumed."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from lightning_accudnn.cli import main
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step
from tests.models import SelfAttention

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
BATCH, LENGTH, DIM, HEADS = 4, 256, 256, 4
#: Dropout's RNG seed and offset, two scalars (fake tensors: a 2-element seed), no more.
RNG_BYTES = 32


def attention_saved(trace, name: str = "attention") -> int:
    return next(layer.saved_bytes for layer in trace.layers if layer.name == name)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize(("gpu", "kernel"), [("h100", "cudnn"), ("a100", "flash")])
def test_bf16_attention_saves_what_cuda_fused_attention_saves(gpu, kernel, dropout) -> None:
    trace = trace_step(
        lambda: SelfAttention(DIM, HEADS, dropout),
        (BATCH, LENGTH, DIM),
        tracker=LayerTracker(),
        dtype="bf16",
        gpu=get_gpu(gpu),
    )
    qkv = BATCH * LENGTH * 3 * DIM * 2  # the projection's output, bf16: q, k and v are views of it
    output = BATCH * LENGTH * DIM * 2
    logsumexp = BATCH * HEADS * LENGTH * 4  # fp32, one per query and head
    saved = attention_saved(trace)
    assert qkv + output + logsumexp <= saved <= qkv + output + logsumexp + RNG_BYTES
    assert trace.kernels == (("scaled_dot_product_attention", kernel, 1),)


def test_cpu_kernels_would_save_the_attention_matrix_with_dropout() -> None:
    """What the target GPU changes: without it the CPU math path saves the s x s matrices."""
    trace = trace_step(
        lambda: SelfAttention(DIM, HEADS, 0.1), (BATCH, LENGTH, DIM), tracker=LayerTracker(), dtype="bf16"
    )
    assert attention_saved(trace) > BATCH * HEADS * LENGTH * LENGTH * 2
    assert trace.kernels == ()


def test_fp32_attention_saves_what_cuda_memory_efficient_attention_saves() -> None:
    trace = trace_step(
        lambda: SelfAttention(DIM, HEADS, 0.1),
        (BATCH, LENGTH, DIM),
        tracker=LayerTracker(),
        gpu=get_gpu("a100"),
    )
    qkv, output = BATCH * LENGTH * 3 * DIM * 4, BATCH * LENGTH * DIM * 4
    logsumexp = BATCH * HEADS * LENGTH * 4  # LENGTH is a multiple of the kernel's 32
    saved = attention_saved(trace)
    assert qkv + output + logsumexp <= saved <= qkv + output + logsumexp + RNG_BYTES
    assert trace.kernels == (("scaled_dot_product_attention", "efficient", 1),)


def test_a_gpu_without_fused_kernels_keeps_the_math_path() -> None:
    trace = trace_step(
        lambda: SelfAttention(DIM, HEADS),
        (BATCH, LENGTH, DIM),
        tracker=LayerTracker(),
        dtype="bf16",
        gpu=get_gpu("v100"),
    )
    assert attention_saved(trace) >= BATCH * HEADS * LENGTH * LENGTH * 4  # fp32 probabilities
    assert trace.kernels == (("scaled_dot_product_attention", "math", 1),)


def test_cli_reports_the_kernels_it_assumed(capsys) -> None:
    args = ["plan", "tests.models:self_attention_with_dropout", "--input-shape", f"{LENGTH},{DIM}"]
    args += ["--batch-size", str(BATCH), "--budget", "80GB", "--gpu", "h100", "--dtype", "bf16"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["assumed_kernels"] == {"scaled_dot_product_attention": {"cudnn": 1}}
    assert main(args) == 0
    assert "kernels assumed    scaled_dot_product_attention: cudnn x1" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_hugging_face_gpt2_attention_saves_what_fused_attention_saves() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, dim, heads = 2, 128, 4
    config = GPT2Config(
        n_embd=dim, n_layer=layers, n_head=heads, vocab_size=512, bos_token_id=0, eos_token_id=0
    )
    config._attn_implementation = "sdpa"  # the library's defaults otherwise (dropout 0.1, a cache)

    def build() -> torch.nn.Module:
        return GPT2LMHeadModel(config)

    trace = trace_step(
        build,
        (BATCH, LENGTH),
        tracker=LayerTracker(),
        input_dtype=torch.long,
        dtype="bf16",
        gpu=get_gpu("h100"),
    )
    # The cache (the library's default) concatenates key and value into tensors of their own.
    qkv_and_cache = BATCH * LENGTH * 3 * dim * 2 + 2 * BATCH * LENGTH * dim * 2
    hand = qkv_and_cache + BATCH * LENGTH * dim * 2 + BATCH * heads * LENGTH * 4
    for block in range(layers):
        assert hand <= attention_saved(trace, f"transformer.h.{block}.attn") <= hand + RNG_BYTES
    kernels = {(op, kernel): calls for op, kernel, calls in trace.kernels}
    assert kernels[("scaled_dot_product_attention", "cudnn")] == layers
    assert kernels[("dropout", "fused (bool mask)")] == 1 + 2 * layers  # embeddings, then two a block


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_gpt2_medium_traced_for_an_h100() -> None:
    """GPT-2 medium, 8 x 1024 tokens, bf16, library defaults (dropout 0.1). Attention saves what
    cuDNN attention saves (the CPU's math path would save the s x s matrices: 53 GB in all); the
    tanh GELU runs ``torch.pow`` in float32 under CUDA autocast, so its saves are mostly float32."""
    from bench.planner.models import gpt2_medium

    batch, length, dim, heads, layers = 8, 1024, 1024, 16, 24
    trace = trace_step(
        gpt2_medium,
        (batch, length),
        tracker=LayerTracker(),
        input_dtype=torch.long,
        dtype="bf16",
        gpu=get_gpu("h100"),
    )
    kernels = {(op, kernel): calls for op, kernel, calls in trace.kernels}
    assert kernels[("scaled_dot_product_attention", "cudnn")] == layers
    assert kernels[("autocast", "CUDA policy: float32")] == layers  # one torch.pow a block
    tokens = batch * length
    attention = tokens * 3 * dim * 2 + 2 * tokens * dim * 2 + tokens * dim * 2 + batch * heads * length * 4
    # pow's float32 input copy, tanh's float32 output, 0.5 x (bf16) and 1 + tanh (float32): the
    # product saves the last two
    gelu = tokens * 4 * dim * (4 + 4 + 2 + 4)
    saved = {layer.name: layer.saved_bytes for layer in trace.layers}
    for block in range(layers):
        assert attention <= saved[f"transformer.h.{block}.attn"] <= attention + RNG_BYTES
        assert saved[f"transformer.h.{block}.mlp.act"] == gelu
    assert 17e9 < trace.saved_bytes < 20e9


class _Float32Ops(torch.nn.Module):
    """A 16-bit activation into ops CUDA autocast runs in float32 and CPU autocast does not."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # bf16 under autocast
        return self.norm(h) + torch.pow(h, 3.0)


@pytest.mark.parametrize(("gpu", "element_bytes"), [(None, 2), ("h100", 4)])
def test_ops_cuda_autocast_runs_in_float32_save_float32_copies(gpu, element_bytes) -> None:
    trace = trace_step(
        _Float32Ops,
        (128, 64),
        tracker=LayerTracker(),
        dtype="bf16",
        gpu=None if gpu is None else get_gpu(gpu),
    )
    saved = {layer.name: layer.saved_bytes for layer in trace.layers}
    # layer_norm saves its input (a float32 copy under CUDA autocast) and its 2 x 128 statistics
    assert saved["norm"] == (128 * 64 + 2 * 128) * element_bytes
    # pow saves its input: the linear's bf16 output, or its float32 copy
    expected_root = 0 if gpu is None else 128 * 64 * 4
    assert saved.get("(root)", 0) == expected_root


def test_multi_head_attention_is_reported_as_traced_on_cpu_kernels() -> None:
    def build() -> torch.nn.Module:
        return torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)

    trace = trace_step(build, (2, 32, 64), tracker=LayerTracker(), gpu=get_gpu("h100"))
    kernels = {(op, kernel): calls for op, kernel, calls in trace.kernels}
    assert kernels[("multi_head_attention_forward", "CPU kernels (not rewritten)")] == 1
