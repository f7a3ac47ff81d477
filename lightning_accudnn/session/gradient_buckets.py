"""Device memory DDP keeps beside the model: its gradient buckets."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["gradient_bucket_bytes"]


def gradient_bucket_bytes(wrapper: nn.Module) -> int:
    """Bytes of the flat gradient buckets ``wrapper`` holds beside the parameters' gradients.

    ``DistributedDataParallel`` reduces gradients in flat buckets that together hold one
    copy of every gradient it synchronises (the parameters that require grad, each storage
    once). With ``gradient_as_bucket_view=True`` the ``.grad`` tensors are views into the
    buckets, so there is no second copy and this is 0; with the default (``False``) it is
    the bytes of those gradients, a second copy the step holds from the first backward on.
    Anything that is not a ``DistributedDataParallel`` holds no buckets (0).

    Example:
        >>> gradient_bucket_bytes(nn.Linear(10, 10))  # not wrapped in DDP: no buckets
        0
    """
    if not isinstance(wrapper, DistributedDataParallel) or wrapper.gradient_as_bucket_view:
        return 0
    seen: set[int] = set()
    total = 0
    for parameter in wrapper.module.parameters():
        key = parameter.untyped_storage().data_ptr()
        if parameter.requires_grad and key not in seen:
            seen.add(key)
            total += parameter.untyped_storage().nbytes()
    return total
