"""What one traced kernel costs: its FLOPs, the tensors it reads and writes, its rate class.

The FLOPs are :mod:`torch.utils.flop_counter`'s formulas, with grouped convolutions' backward
corrected, plus the CPU flash attention kernels it has none for (:data:`FLOP_FORMULAS`, by
overload packet). :mod:`.trace` records one :class:`~.roofline.OpCost` per kernel with them.

Example:
    >>> out = torch.ones(4, 8)
    >>> formula = FLOP_FORMULAS[torch.ops.aten.mm]
    >>> formula(torch.ones(4, 3), torch.ones(3, 8), out_val=out)
    192
    >>> sum(tensor_bytes(t) for t in tensors_in(((torch.ones(4, 3), torch.ones(3, 8)), {})))
    144
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import conv_flop_count, flop_registry, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["FLOP_FORMULAS", "FREE_OPS", "rate_class", "tensor_bytes", "tensors_in"]

_aten = torch.ops.aten
#: Kernels that move no data (allocation only) or are bookkeeping.
FREE_OPS = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
    _aten.lift_fresh.default,
    torch.ops.prim.device.default,
}
_CONVOLUTIONS = {_aten.convolution, _aten._convolution, _aten.convolution_backward}


def _cpu_flash_flops(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: object, **kwargs: object
) -> int:
    return int(sdpa_flop_count(query.shape, key.shape, value.shape))  # type: ignore[no-untyped-call]


def _cpu_flash_backward_flops(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: object,
    **kwargs: object,
) -> int:
    return int(
        sdpa_backward_flop_count(  # type: ignore[no-untyped-call]
            grad_out.shape, query.shape, key.shape, value.shape
        )
    )


def _convolution_backward_flops(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: object,
    stride: object,
    padding: object,
    dilation: object,
    transposed: bool,
    output_padding: object,
    groups: int,
    output_mask: list[bool],
    *args: object,
    out_val: object = None,
    **kwargs: object,
) -> int:
    """The input gradient and the weight gradient each take as many multiply-adds as the
    forward. (``flop_counter`` counts the weight gradient as a convolution over every input
    channel, ``groups`` times too many: 8x to 19x the forward for depthwise convolutions.)"""
    forward = conv_flop_count(list(input.shape), list(weight.shape), list(grad_out.shape), transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


#: ``flop_counter``'s formulas, with grouped convolutions' backward corrected, plus the CPU
#: flash attention kernels it has none for.
FLOP_FORMULAS = {
    **flop_registry,
    _aten.convolution_backward: _convolution_backward_flops,
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
}


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the tensor's elements (not of its storage).

    Example:
        >>> tensor_bytes(torch.zeros(2, 3, dtype=torch.bfloat16))
        12
    """
    return tensor.numel() * tensor.element_size()


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in a kernel's arguments or outputs (nested in tuples, lists and dict values),
    in the order ``tree_flatten`` lists them; what a kernel takes and returns holds no other
    container of tensors.

    Example:
        >>> a, b = torch.zeros(1), torch.ones(2)
        >>> [t.numel() for t in tensors_in(((a, [b, 3]), {"out": a, "dim": 0}))]
        [1, 2, 1]
    """
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def rate_class(func: torch._ops.OpOverload, tensors: list[torch.Tensor]) -> str:
    """The peak rate a kernel runs at (a key of ``GpuSpec.peak_flops``): the dtype of its first
    floating-point input, ``"fp32-conv"`` for an fp32 convolution.

    Example:
        >>> rate_class(torch.ops.aten.mm.default, [torch.ones(2, dtype=torch.bfloat16)])
        'bf16'
        >>> rate_class(torch.ops.aten.convolution.default, [torch.ones(2)])
        'fp32-conv'
    """
    dtype = "fp32"
    for arg in tensors:
        if arg.is_floating_point():
            dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(arg.dtype, "fp32")
            break
    if dtype == "fp32" and func._overloadpacket in _CONVOLUTIONS:
        return "fp32-conv"
    return dtype
