"""Which ``scaled_dot_product_attention`` kernel a CUDA GPU runs, and that kernel for a trace.

``F.scaled_dot_product_attention`` picks a kernel per call: PyTorch tries its backends in
order and takes the first whose constraints the call meets (``select_sdp_backend`` in
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``). The default order is
FlashAttention-2 (``flash``), the memory-efficient kernel (``efficient``), the math fallback
(``math``), with cuDNN attention (``cudnn``) last, which the math fallback shadows; on compute
capability 9.0 and 10.0 (H100, H200, B200) recent PyTorch builds (cuDNN 9.9 or later, unless
``TORCH_CUDNN_SDPA_PREFERRED=0``) put ``cudnn`` first. This module assumes such a build, with
cuDNN 9.10 or later (head dimensions up to 256 on 9.0) and dropout supported. The kernels save
different tensors for backward:

* ``flash`` and ``cudnn``: query, key, value, the output and the log-sum-exp (fp32, one per
  query and head), plus the dropout RNG seed and offset (a few bytes): no ``s x s`` matrix,
  dropout included (the mask is regenerated from the seed in backward); ``cudnn`` also the
  additive mask it receives, if any;
* ``efficient``: the same as ``flash``, plus the additive mask as the kernel receives it (a
  boolean mask becomes a float mask of the query's dtype);
* ``math``: the attention probabilities (``s x s`` per head, in fp32 for 16-bit inputs: the
  CUDA math path upcasts them unless ``allow_fp16_bf16_reduction_math_sdp`` is set) and,
  with dropout, a mask.

The CPU runs other kernels (its math path with dropout or a mask), so a trace on CPU fake
tensors would save what no GPU saves. :func:`attention_kernel` chooses as a GPU of compute
capability ``capability`` would, from the constraints that decide it for dense inputs (all
need 4-D inputs of one batch size, a contiguous last dimension and non-empty sequences):

* cudnn (first on 9.0 and 10.0 only): compute capability 8.0 to 12.1; fp16 or bf16; head
  dimensions multiples of 8, at most 256 on 9.0 and 128 elsewhere; keys longer than one;
  key and value heads dividing the query heads only with ``enable_gqa``;
* flash: compute capability 8.0 to 12.1; fp16 or bf16; no ``attn_mask``; query, key and value
  of the same head dimension, at most 256 (with gradients on 8.6, 8.9, 12.0 and 12.1 not in
  192-224, nor above 224 with dropout); grouped-query heads only with ``enable_gqa``;
  ``is_causal`` only when queries and keys are equally long;
* efficient: compute capability 5.0 or later; fp32 or fp16, and bf16 from 8.0; the same
  number of heads (no grouped-query attention); query and key of the same head dimension,
  each head dimension a multiple of 8 (16-bit) or 4 (fp32) from 8.0, of 8 (16-bit) on 7.x,
  of 1 otherwise;
* math otherwise.

:func:`run_attention` then runs the chosen kernel's ATen operator (which fake tensors and
autograd support on any device), so that autograd saves what the GPU's kernel saves.

Example:
    >>> import torch
    >>> q = torch.zeros(2, 16, 1024, 64, dtype=torch.bfloat16)
    >>> attention_kernel((9, 0), q, q, q, dropout_p=0.1, is_causal=True)
    'cudnn'
    >>> attention_kernel((8, 0), q, q, q, dropout_p=0.1, is_causal=True)
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

__all__ = ["ATTENTION_KERNELS", "CUDNN", "EFFICIENT", "FLASH", "MATH", "attention_kernel", "run_attention"]

CUDNN, FLASH, EFFICIENT, MATH = "cudnn", "flash", "efficient", "math"
#: The kernels :func:`attention_kernel` chooses from.
ATTENTION_KERNELS = (CUDNN, FLASH, EFFICIENT, MATH)
#: Compute capabilities on which PyTorch tries cuDNN attention first.
CUDNN_FIRST = frozenset({(9, 0), (10, 0)})

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


def _heads_fit(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool) -> bool:
    heads, kv_heads = query.shape[1], key.shape[1]
    return key.shape[1] == value.shape[1] and (
        heads == kv_heads or (enable_gqa and kv_heads > 0 and heads % kv_heads == 0)
    )


def _fused_16_bit(
    capability: tuple[int, int], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> bool:
    """What cuDNN and flash attention both need: 8.0 to 12.1, 16 bits, dense 4-D inputs."""
    return (8, 0) <= capability <= (12, 1) and query.dtype in _HALF and _dense_4d(query, key, value)


def _can_cudnn(
    capability: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    enable_gqa: bool,
) -> bool:
    if not _fused_16_bit(capability, query, key, value) or key.shape[2] == 1:
        return False
    limit = 256 if capability == (9, 0) else 128
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    if head_dim > limit or value_dim > limit or head_dim % 8 or value_dim % 8:
        return False
    return _heads_fit(query, key, value, enable_gqa) and _last_dim_contiguous(
        (query, key, value), ignore_singleton=True
    )


def _can_flash(
    capability: tuple[int, int],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
) -> bool:
    if attn_mask is not None or not _fused_16_bit(capability, query, key, value):
        return False
    head_dim = query.shape[-1]
    if not (head_dim == key.shape[-1] == value.shape[-1] and head_dim <= 256):
        return False
    grads = query.requires_grad or key.requires_grad or value.requires_grad
    narrow = (8, 6) <= capability <= (8, 9) or (12, 0) <= capability <= (12, 1)
    if grads and narrow and (192 < head_dim <= 224 or (head_dim > 224 and dropout_p > 0)):
        return False
    if is_causal and query.shape[2] != key.shape[2]:
        return False
    return _heads_fit(query, key, value, enable_gqa) and _last_dim_contiguous(
        (query, key, value), ignore_singleton=True
    )


def _gemm_alignment(capability: tuple[int, int], dtype: torch.dtype) -> int:
    half = dtype in _HALF
    alignment = 4 if capability >= (8, 0) else 1
    if capability >= (8, 0) or (capability >= (7, 0) and half):  # tensor cores
        alignment = max(alignment, 128 // (16 if half else 32))
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
    """The kernel (``"cudnn"``, ``"flash"``, ``"efficient"`` or ``"math"``) a CUDA GPU of
    compute capability ``capability`` runs for this call (see the module docstring).

    The tensors are those the kernel receives (after autocast). Every fused kernel supports
    dropout; ``dropout_p`` matters only for flash attention's large head dimensions on 8.6,
    8.9, 12.0 and 12.1.

    Example:
        >>> import torch
        >>> q = torch.zeros(1, 8, 128, 64, dtype=torch.float16)
        >>> k = torch.zeros(1, 2, 128, 64, dtype=torch.float16)
        >>> attention_kernel((8, 0), q, k, k, enable_gqa=True), attention_kernel((8, 0), q, k, k)
        ('flash', 'math')
        >>> mask = torch.ones(128, 128, dtype=torch.bool)
        >>> [attention_kernel(capability, q, q, q, attn_mask=mask) for capability in ((8, 0), (9, 0))]
        ['efficient', 'cudnn']
    """
    if capability in CUDNN_FIRST and _can_cudnn(capability, query, key, value, enable_gqa):
        return CUDNN
    if _can_flash(capability, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
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

    ``"cudnn"`` runs ``aten._scaled_dot_product_cudnn_attention`` (a boolean mask made
    additive), ``"flash"`` runs ``aten._scaled_dot_product_flash_attention`` (head dimensions padded to
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
    if kernel == CUDNN:
        grads = any(t.requires_grad for t in (query, key, value))
        cudnn: torch.Tensor = torch.ops.aten._scaled_dot_product_cudnn_attention(
            query,
            key,
            value,
            _as_bias(attn_mask, query.dtype),
            grads,
            dropout_p,
            is_causal,
            False,
            scale=scale,
        )[0]
        return cudnn
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
