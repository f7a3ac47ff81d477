"""Every use of a private PyTorch name in ``ops``, in one place."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["tracks_running_statistics", "top_saved_tensor_hooks"]


def top_saved_tensor_hooks() -> object:
    """The innermost ``saved_tensors_hooks`` pair in force now (``None`` when there is none).

    Non-reentrant checkpointing pushes its own pair around the region it checkpoints, so a
    module that runs under a pair other than the one its pass started with is checkpointed.
    """
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def tracks_running_statistics(module: nn.Module) -> bool:
    """A batch or instance norm that updates running statistics when called now."""
    return (
        isinstance(module, nn.modules.batchnorm._NormBase) and module.training and module.track_running_stats
    )
