"""The trace saves what the target GPU's attention kernel saves, and says which kernel it assumed."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from lightning_accudnn.cli import main
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.planner.gpus import get_gpu
from lightning_accudnn.planner.trace import trace_step
from tests.models import SelfAttention

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
BATCH, LENGTH, DIM, HEADS = 4, 256, 256, 4
#: Dropout's RNG seed and offset, two scalars (fake tensors: a 2-element seed), no more.
RNG_BYTES = 32


def attention_saved(trace, name: str = "attention") -> int:
    return next(layer.saved_bytes for layer in trace.layers if layer.name == name)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_bf16_attention_saves_what_cuda_flash_saves(dropout) -> None:
    trace = trace_step(
        lambda: SelfAttention(DIM, HEADS, dropout),
        (BATCH, LENGTH, DIM),
        tracker=LayerTracker(),
        dtype="bf16",
        gpu=get_gpu("h100"),
    )
    qkv = BATCH * LENGTH * 3 * DIM * 2  # the projection's output, bf16: q, k and v are views of it
    output = BATCH * LENGTH * DIM * 2
    logsumexp = BATCH * HEADS * LENGTH * 4  # fp32, one per query and head
    saved = attention_saved(trace)
    assert qkv + output + logsumexp <= saved <= qkv + output + logsumexp + RNG_BYTES
    assert trace.kernels == (("scaled_dot_product_attention", "flash", 1),)


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
    assert report["assumed_kernels"] == {"scaled_dot_product_attention": {"flash": 1}}
    assert main(args) == 0
    assert "kernels assumed    scaled_dot_product_attention: flash x1" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_hugging_face_gpt2_attention_saves_what_flash_saves() -> None:
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
    assert kernels[("scaled_dot_product_attention", "flash")] == layers
    assert kernels[("dropout", "fused (bool mask)")] == 1 + 2 * layers  # embeddings, then two a block


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_gpt2_medium_traced_for_an_h100_saves_at_most_16_gb() -> None:
    """GPT-2 medium, 8 x 1024 tokens, bf16, library defaults (dropout 0.1): about 14 GB, where the
    CPU's math attention would save the attention matrices (over 50 GB)."""
    from bench.planner.models import gpt2_medium

    trace = trace_step(
        gpt2_medium,
        (8, 1024),
        tracker=LayerTracker(),
        input_dtype=torch.long,
        dtype="bf16",
        gpu=get_gpu("h100"),
    )
    assert trace.saved_bytes <= 16e9
    assert (
        dict(((op, kernel), calls) for op, kernel, calls in trace.kernels)[
            ("scaled_dot_product_attention", "flash")
        ]
        == 24
    )
