"""Which attention kernel a CUDA GPU runs for a call, and the kernels' ATen operators."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lightning_accudnn.profiling.attention import (
    CUDNN,
    EFFICIENT,
    FLASH,
    MATH,
    attention_kernel,
    run_attention,
)

H100, A100, L4, V100, B200 = (9, 0), (8, 0), (8, 9), (7, 0), (10, 0)
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def qkv(
    heads: int = 8, kv_heads: int = 8, length: int = 128, kv_length: int = 128, dim: int = 64, dtype=BF16
):
    q = torch.zeros(2, heads, length, dim, dtype=dtype)
    k = torch.zeros(2, kv_heads, kv_length, dim, dtype=dtype)
    return q, k, k.clone()


@pytest.mark.parametrize(
    ("capability", "tensors", "options", "expected"),
    [
        (H100, qkv(), {"dropout_p": 0.1, "is_causal": True}, CUDNN),  # cuDNN first on 9.0
        (A100, qkv(), {"dropout_p": 0.1, "is_causal": True}, FLASH),
        (A100, qkv(dtype=FP16), {}, FLASH),
        (H100, qkv(dtype=FP32), {"dropout_p": 0.1}, EFFICIENT),  # the fused kernels are 16-bit only
        (H100, qkv(), {"attn_mask": torch.ones(128, 128, dtype=torch.bool)}, CUDNN),
        (A100, qkv(), {"attn_mask": torch.ones(128, 128, dtype=torch.bool)}, EFFICIENT),  # flash: no mask
        (H100, qkv(kv_heads=2), {"enable_gqa": True}, CUDNN),
        (A100, qkv(kv_heads=2), {"enable_gqa": True}, FLASH),
        (H100, qkv(kv_heads=2, dtype=FP32), {"enable_gqa": True}, MATH),  # efficient has no GQA
        (H100, qkv(kv_heads=2), {}, MATH),  # heads differ without enable_gqa
        (A100, qkv(kv_length=256), {"is_causal": True}, EFFICIENT),  # flash: causal only square
        (A100, qkv(kv_length=256), {}, FLASH),
        (H100, qkv(kv_length=1), {}, FLASH),  # cuDNN needs keys longer than one
        (H100, qkv(dim=256), {}, CUDNN),
        (B200, qkv(dim=256), {}, FLASH),  # cuDNN stops at 128 there
        (A100, qkv(dim=256), {}, FLASH),
        (H100, qkv(dim=264), {}, EFFICIENT),  # flash and cuDNN stop at 256
        (H100, qkv(dim=260), {}, MATH),  # 260 is no multiple of 8 for 16-bit efficient
        (L4, qkv(dim=208), {"requires_grad": True}, EFFICIENT),  # sm89: not 192-224 with grads
        (L4, qkv(dim=256), {"requires_grad": True}, FLASH),
        (L4, qkv(dim=256), {"requires_grad": True, "dropout_p": 0.1}, EFFICIENT),  # above 224 with dropout
        (L4, qkv(dim=208), {}, FLASH),
        (V100, qkv(dtype=FP16), {}, EFFICIENT),  # flash needs 8.0
        (V100, qkv(dtype=FP16, dim=20), {}, MATH),  # 16-bit on 7.0: multiples of 8
        (V100, qkv(dtype=FP32, dim=20), {}, EFFICIENT),  # fp32 on 7.0: any head dimension
        (V100, qkv(), {}, MATH),  # bf16 efficient needs 8.0
    ],
)
def test_kernel_as_pytorch_chooses_on_cuda(capability, tensors, options, expected) -> None:
    options = dict(options)
    q, k, v = tensors
    if options.pop("requires_grad", False):
        q.requires_grad_(True)
    assert attention_kernel(capability, q, k, v, **options) == expected


def test_three_dimensional_inputs_take_the_math_kernel() -> None:
    q = torch.zeros(8, 128, 64, dtype=BF16)
    assert attention_kernel(H100, q, q, q) == MATH


@pytest.mark.parametrize("kernel", [CUDNN, FLASH, EFFICIENT, MATH])
@pytest.mark.parametrize("dim", [64, 20])
def test_every_kernel_gives_the_shape_and_dtype_of_sdpa(kernel, dim) -> None:
    with FakeTensorMode():
        q = torch.zeros(2, 4, 64, dim, dtype=BF16, requires_grad=True)
        out = run_attention(kernel, q, q, q, dropout_p=0.1, is_causal=True)
        out.float().sum().backward()
        assert out.shape == (2, 4, 64, dim) and out.dtype == BF16
        assert q.grad is not None and q.grad.shape == q.shape


def test_unknown_kernel_is_refused() -> None:
    q = torch.zeros(1, 1, 8, 8)
    with pytest.raises(ValueError, match="cudnn, flash, efficient, math"):
        run_attention("sparse", q, q, q)
