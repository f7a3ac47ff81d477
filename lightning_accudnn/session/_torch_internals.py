"""Every use of a private PyTorch name in the session, in one place (each is used by PyTorch's
own distributed code too, so it is as stable as a private name gets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "copy_all",
    "default_store",
    "run_when_backward_ends",
    "tensor_leaves",
]


def run_when_backward_ends(callback: Callable[[], None]) -> None:
    """Queue ``callback`` to run once the backward pass now running has finished.

    Must be called from inside a backward (a tensor or grad hook). It is the mechanism DDP
    and FSDP use to finish their reductions; an exception the callback raises propagates out
    of ``backward()`` with its own type.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors in any nesting of lists, tuples and dicts."""
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(tree)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def copy_all(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``destination.copy_(source)`` for each pair, in as few kernels as possible
    (``torch._foreach_copy_``, what PyTorch's optimizers use)."""
    if destinations:
        torch._foreach_copy_(destinations, sources)


def default_store() -> Any:
    """The key-value store of the default process group (what ranks rendezvoused through).

    ``torch.distributed.distributed_c10d._get_default_store``; PyTorch's own elastic and
    checkpoint code reads it the same way. ``None`` outside an initialised process group.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store()
