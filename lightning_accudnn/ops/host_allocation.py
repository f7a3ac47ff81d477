"""The engine's host buffers, made where a device allocator can tell them from device memory.

Swapped activations go to host buffers that every runtime makes with :func:`new_host_buffer`.
On a GPU they are host memory, which the device's allocator never counts. On CPU host and
"device" share one heap, so an allocator that counts the tensors ops create
(:class:`lightning_accudnn.testing.OpBytesAllocator`) asks :func:`making_host_buffer` whether a
tensor being created is one of them: a flat ``uint8`` tensor may as well be a copy brought back
to the device, which is device memory.

Example:
    >>> buffer = new_host_buffer(64, pin_memory=False)
    >>> buffer.dtype, buffer.numel(), making_host_buffer()
    (torch.uint8, 64, False)
"""

from __future__ import annotations

import threading

import torch

__all__ = ["making_host_buffer", "new_host_buffer"]

_making = threading.local()


def new_host_buffer(nbytes: int, *, pin_memory: bool) -> torch.Tensor:
    """A host buffer of ``nbytes`` (``uint8``), pinned when ``pin_memory`` is set; while it is
    made, :func:`making_host_buffer` is true on this thread."""
    _making.active = True
    try:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
    finally:
        _making.active = False


def making_host_buffer() -> bool:
    """Whether this thread is making a host buffer now (:func:`new_host_buffer`): a tensor an op
    creates meanwhile is host memory."""
    return getattr(_making, "active", False)
