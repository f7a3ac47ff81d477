"""How a tensor lies in its storage, as the engine's swaps and both sources of a profile (a
session's profiling pass, ``accudnn plan``'s trace) must agree on it: a dense tensor can be
copied laid out as it is, and one that holds its storage whole is what a swap of that storage
copies."""

from __future__ import annotations

import torch

__all__ = ["holds_storage_whole", "is_dense"]


def is_dense(tensor: torch.Tensor) -> bool:
    """No gaps, no overlap, so a copy can be laid out like it: contiguous, channels-last or any
    other order of the same strides (attention's heads transposed out of a projection).

    Example:
        >>> images = torch.zeros(2, 3, 4, 4)
        >>> is_dense(images.to(memory_format=torch.channels_last)), is_dense(images[:, :2])
        (True, False)
    """
    if tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last):
        return True
    expected = 1
    for stride, size in sorted(zip(tensor.stride(), tensor.shape, strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def holds_storage_whole(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` reads every byte of its storage and nothing twice (dense, from the
    storage's start to its end): a save of it the engine swaps copies just that storage.

    Example:
        >>> images = torch.zeros(2, 3, 4, 4)
        >>> holds_storage_whole(images.to(memory_format=torch.channels_last)), holds_storage_whole(images[1])
        (True, False)
    """
    return (
        not tensor.storage_offset()
        and tensor.nbytes == tensor.untyped_storage().nbytes()
        and is_dense(tensor)
    )
