"""Which ``scaled_dot_product_attention`` kernel a CUDA GPU runs, and that kernel for a trace.

``F.scaled_dot_product_attention`` picks a kernel per call. On a CUDA device PyTorch tries,
in order, FlashAttention-2 (``flash``), the memory-efficient kernel (``efficient``) and the
math fallback (``math``), taking the first whose constraints the call meets (PyTorch's
``select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``; cuDNN
attention comes after the math fallback in the default order, so it is never chosen while the
math kernel is enabled). The kernels save different tensors for backward:

* ``flash``: query, key, value, the output and the log-sum-exp (``batch x heads x queries``,
  fp32), plus the dropout RNG seed and offset (a few bytes): no ``s x s`` matrix, dropout
  included (the mask is regenerated from the seed in backward);
* ``efficient``: the same, plus the additive mask as the kernel receives it (a boolean mask
  becomes a float mask of the query's dtype);
* ``math``: the attention probabilities (``s x s`` per head, in fp32 for 16-bit inputs: the
  CUDA math path upcasts them unless ``allow_fp16_bf16_reduction_math_sdp`` is set) and,
  with dropout, a mask.

The CPU runs other kernels (its math path with dropout or a mask), so a trace on CPU fake
tensors would save what no GPU saves. :func:`attention_kernel` chooses as a GPU of compute
capability ``capability`` would, from the constraints that decide it for dense inputs:

* flash: compute capability 8.0 or later; fp16 or bf16; no ``attn_mask``; 4-D inputs of one
  batch size; query, key and value of the same head dimension, at most 256 (at most 192 with
  gradients on 8.6 and 8.9); key and value heads dividing the query heads only with
  ``enable_gqa``; ``is_causal`` only when queries and keys are equally long; last dimension
  contiguous;
* efficient: compute capability 5.0 or later; fp32 or fp16, and bf16 from 8.0; 4-D inputs
  with the same number of heads (no grouped-query attention); query and key of the same head
  dimension, each head dimension a multiple of 8 (16-bit dtypes) or 4 (fp32) from 8.0 (of
  ``128 / bits`` on 7.5, of 1 before); last dimension contiguous;
* math otherwise.

:func:`run_attention` then runs the chosen kernel's ATen operator (which fake tensors and
autograd support on any device), so that autograd saves what the GPU's kernel saves.

Example:
    >>> import torch
    >>> q = torch.zeros(2, 16, 1024, 64, dtype=torch.bfloat16)
    >>> attention_kernel((9, 0), q, q, q, dropout_p=0.1, is_causal=True)
    'flash'
    >>> attention_kernel((9, 0), q.float(), q.float(), q.float())
    'efficient'
    >>> attention_kernel((7, 0), q, q, q)
    'math'
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["ATTENTION_KERNELS", "EFFICIENT", "FLASH", "MATH", "attention_kernel", "run_attention"]

FLASH, EFFICIENT, MATH = "flash", "efficient", "math"
#: The kernels :func:`attention_kernel` chooses from, in PyTorch's order of preference.
ATTENTION_KERNELS = (FLASH, EFFICIENT, MATH)

_HALF = (torch.float16, torch.bfloat16)


def _dense_4d(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    return (
        query.dim() == key.dim() == value.dim() == 4
        and query.shape[0] == key.shape[0] == value.shape[0]
        and query.shape[2] > 0
        and key.shape[2] > 0
    )


def _last_dim_contiguous(tensors: tuple[torch.Tensor, ...], ignore_singleton: bool) -> bool:
    return all(t.stride(-1) == 1 or (ignore_singleton and t.shape[-1] == 1) for t in tensors)


def _can_flash(
    capability: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
) -> bool:
    if capability < (8, 0) or attn_mask is not None or query.dtype not in _HALF:
        return False
    if not _dense_4d(query, key, value):
        return False
    head_dim = query.shape[-1]
    if not (head_dim == key.shape[-1] == value.shape[-1] and head_dim <= 256):
        return False
    grads = query.requires_grad or key.requires_grad or value.requires_grad
    if capability in {(8, 6), (8, 9)} and grads and head_dim > 192:
        return False
    if is_causal and query.shape[2] != key.shape[2]:
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    if key.shape[1] != value.shape[1] or (
        heads != kv_heads and not (enable_gqa and kv_heads > 0 and heads % kv_heads == 0)
    ):
        return False
    return _last_dim_contiguous((query, key, value), ignore_singleton=True)


def _gemm_alignment(capability: tuple[int, int], dtype: torch.dtype) -> int:
    bits = 16 if dtype in _HALF else 32
    alignment = 4 if capability >= (8, 0) else 1
    if capability >= (7, 5):  # tensor cores
        alignment = max(alignment, 128 // bits)
    return alignment


def _can_efficient(
    capability: tuple[int, int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> bool:
    if capability < (5, 0):
        return False
    dtypes = (
        (torch.float32, torch.float16, torch.bfloat16)
        if capability >= (8, 0)
        else (torch.float32, torch.float16)
    )
    if query.dtype not in dtypes or not _dense_4d(query, key, value):
        return False
    if not (query.shape[1] == key.shape[1] == value.shape[1]):
        return False
    alignment = _gemm_alignment(capability, query.dtype)
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    if head_dim != key.shape[-1] or head_dim % alignment or value_dim % alignment:
        return False
    return _last_dim_contiguous((query, key, value), ignore_singleton=False)


def attention_kernel(
    capability: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> str:
    """The kernel (``"flash"``, ``"efficient"`` or ``"math"``) a CUDA GPU of compute
    capability ``capability`` runs for this call (see the module docstring).

    The tensors are those the kernel receives (after autocast). ``dropout_p`` does not
    change the choice: both fused kernels support dropout.

    Example:
        >>> import torch
        >>> q = torch.zeros(1, 8, 128, 64, dtype=torch.float16)
        >>> k = torch.zeros(1, 2, 128, 64, dtype=torch.float16)
        >>> attention_kernel((8, 0), q, k, k, enable_gqa=True), attention_kernel((8, 0), q, k, k)
        ('flash', 'math')
        >>> attention_kernel((8, 0), q, q, q, attn_mask=torch.ones(128, 128, dtype=torch.bool))
        'efficient'
    """
    del dropout_p  # both fused kernels take dropout
    if _can_flash(capability, query, key, value, attn_mask, is_causal, enable_gqa):
        return FLASH
    if _can_efficient(capability, query, key, value):
        return EFFICIENT
    return MATH


def _as_bias(attn_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive mask the efficient kernel receives (a boolean mask: 0 kept, -inf not)."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    bias = torch.zeros(attn_mask.shape, dtype=dtype)
    return bias.masked_fill(attn_mask.logical_not(), -math.inf)


def run_attention(
    kernel: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s output, computed by ``kernel``'s ATen operator.

    ``"flash"`` runs ``aten._scaled_dot_product_flash_attention`` (head dimensions padded to
    a multiple of 8, as PyTorch's CUDA entry does), ``"efficient"`` runs
    ``aten._scaled_dot_product_efficient_attention`` (a boolean mask made additive),
    ``"math"`` runs ``aten._scaled_dot_product_attention_math``. The fused kernels have no
    CPU implementation: call them on fake (or meta) tensors, as a trace does.

    Example:
        >>> from torch._subclasses.fake_tensor import FakeTensorMode
        >>> with FakeTensorMode():
        ...     q = torch.zeros(2, 4, 128, 64, dtype=torch.bfloat16, requires_grad=True)
        ...     out = run_attention("flash", q, q, q, dropout_p=0.1, is_causal=True)
        >>> tuple(out.shape), out.dtype
        ((2, 4, 128, 64), torch.bfloat16)
    """
    if kernel == FLASH:
        head_dim = query.shape[-1]
        pad = -head_dim % 8
        if pad:
            query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
        if scale is None:
            scale = 1 / math.sqrt(head_dim)  # of the unpadded head dimension
        out: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
        return out[..., :head_dim] if pad else out
    if kernel == EFFICIENT:
        grads = any(t.requires_grad for t in (query, key, value))
        bias = _as_bias(attn_mask, query.dtype)
        efficient: torch.Tensor = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, grads, dropout_p, is_causal, scale=scale
        )[0]
        return efficient
    if kernel == MATH:
        dtype = query.dtype
        if dtype in _HALF:  # CUDA's math path computes 16-bit inputs in fp32 (saving fp32 probabilities)
            query, key, value = query.float(), key.float(), value.float()
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.float()
        math_out: torch.Tensor = torch.ops.aten._scaled_dot_product_attention_math(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            None,
            scale=scale,
            enable_gqa=enable_gqa,
        )[0]
        return math_out.to(dtype)
    raise ValueError(f"unknown attention kernel {kernel!r}; choose one of: {', '.join(ATTENTION_KERNELS)}")
