"""CUDA's autocast policy where it differs from the CPU's, for a trace on CPU fake tensors.

A mixed-precision trace runs under ``torch.autocast("cpu")``, whose op lists differ from CUDA's
(PyTorch's "Autocast Op Reference"). Where they differ, the dtype of what autograd saves
differs: under CUDA autocast ``torch.pow`` (GPT-2's tanh GELU), ``exp``, ``rsqrt``,
``layer_norm``, ``group_norm``, ``softmax``, ``log_softmax``, ``sum`` and the losses run in
float32, so a 16-bit input is saved as a float32 copy (``layer_norm``) or the float32 result
is saved by the ops after it; the CPU policy leaves them in 16 bits. ``einsum``, ``mv``,
``addmv``, ``addr``, ``chain_matmul`` and ``linalg.multi_dot`` run in 16 bits under CUDA
autocast and not under the CPU's.

:func:`cuda_autocast_args` rewrites a call's arguments as CUDA autocast would cast them
before the op runs (calls with an explicit ``dtype=`` are not eligible, as on CUDA).

Example:
    >>> import torch
    >>> x = torch.ones(4, dtype=torch.bfloat16)
    >>> args, kwargs, policy = cuda_autocast_args(torch.pow, (x, 3.0), {}, torch.bfloat16)
    >>> args[0].dtype, policy
    (torch.float32, 'float32')
    >>> cuda_autocast_args(torch.add, (x, x), {}, torch.bfloat16)[2] is None
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["CUDA_FP32_OPS", "CUDA_ONLY_LOWER_PRECISION_OPS", "cuda_autocast_args"]

#: Ops CUDA autocast runs in float32 ("CUDA Ops that can autocast to float32") that CPU autocast
#: does not (its float32 list has the losses, ``prod`` and ``cdist`` too: casting them again
#: changes nothing).
CUDA_FP32_OPS = frozenset(
    {
        "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
        "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum",
        "dist", "erfinv", "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss",
        "layer_norm", "log", "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
        "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
        "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss",
        "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss",
    }
)  # fmt: skip
#: Ops CUDA autocast runs in 16 bits ("CUDA Ops that can autocast to float16") that CPU autocast
#: does not.
CUDA_ONLY_LOWER_PRECISION_OPS = frozenset({"einsum", "mv", "addmv", "addr", "chain_matmul", "multi_dot"})

_HALF = (torch.float16, torch.bfloat16)


def _cast(value: object, wanted: Callable[[torch.Tensor], torch.dtype | None]) -> object:
    if isinstance(value, torch.Tensor):
        dtype = wanted(value)
        return value.to(dtype) if dtype is not None else value
    if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
        return type(value)(_cast(item, wanted) for item in value)
    return value


def cuda_autocast_args(
    func: Callable[..., object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    dtype: torch.dtype,
) -> tuple[tuple[object, ...], dict[str, object], str | None]:
    """``(args, kwargs, policy)`` of a call under CUDA autocast to ``dtype``: tensors cast to
    float32 (``policy`` ``"float32"``) or to ``dtype`` (``"16-bit"``) where CUDA's policy
    differs from the CPU's (see the module docstring), else unchanged with ``policy`` ``None``.

    Example:
        >>> import torch
        >>> x = torch.ones(2, 2)
        >>> args, _, policy = cuda_autocast_args(torch.einsum, ("ij,jk->ik", x, x), {}, torch.float16)
        >>> [a.dtype for a in args[1:]], policy
        ([torch.float16, torch.float16], '16-bit')
        >>> explicit = {"dtype": torch.float16}  # not eligible
        >>> cuda_autocast_args(torch.softmax, (x.half(), 0), explicit, torch.float16)[2] is None
        True
    """
    name = getattr(func, "__name__", None)
    if "dtype" in kwargs and kwargs["dtype"] is not None:
        return args, kwargs, None
    if name in CUDA_FP32_OPS:

        def wanted(tensor: torch.Tensor) -> torch.dtype | None:
            return torch.float32 if tensor.dtype in _HALF else None

        policy = "float32"
    elif name in CUDA_ONLY_LOWER_PRECISION_OPS:

        def wanted(tensor: torch.Tensor) -> torch.dtype | None:
            return dtype if tensor.dtype == torch.float32 else None

        policy = "16-bit"
    else:
        return args, kwargs, None
    new_args = tuple(_cast(arg, wanted) for arg in args)
    new_kwargs = {key: _cast(value, wanted) for key, value in kwargs.items()}
    changed = any(a is not b for a, b in zip(new_args, args, strict=True)) or any(
        new_kwargs[key] is not kwargs[key] for key in kwargs
    )
    return new_args, new_kwargs, policy if changed else None
