"""Close a training pass when the backward through the model's output has finished.

A plain loop runs ``loss.backward()`` itself, outside the session's block, so the session
cannot call anything after it. Instead, the model's outputs get a gradient hook
(:func:`torch.autograd.graph.register_multi_grad_hook` in ``"any"`` mode: it fires once,
when backward first reaches one of them); the hook queues a callback with the autograd
engine, which runs it once that whole backward has finished, before ``backward()``
returns. An exception in the callback (a budget too small for any plan) therefore
propagates out of ``loss.backward()``, before the optimizer can step.

Why this one: a hook on the loss is not possible (the session never sees it); hooks on
every parameter would cost a walk over the parameters each step and fire before the rest
of the backward (input gradients) ends; a module full-backward hook fires when that
module's backward is done, not the graph's. The engine's callback queue is what DDP and
FSDP rely on to finish their reductions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from lightning_accudnn.session._torch_internals import run_when_backward_ends, tensor_leaves

__all__ = ["BackwardEnd"]


class BackwardEnd:
    """Calls ``callback`` after each backward that reaches a watched output.

    Example:
        >>> calls = []
        >>> end = BackwardEnd(lambda: calls.append("closed"))
        >>> x = torch.ones(3, requires_grad=True)
        >>> y = x * 2
        >>> end.watch(y)
        >>> y.sum().backward()
        >>> calls
        ['closed']
    """

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self._queued = False
        self._handles: list[RemovableHandle] = []

    def watch(self, output: Any) -> None:
        """Hook the tensors in ``output`` that backward can reach."""
        tensors = [t for t in tensor_leaves(output) if t.requires_grad]
        if tensors:
            hook = torch.autograd.graph.register_multi_grad_hook(tensors, self._reached, mode="any")
            self._handles.append(hook)

    def remove(self) -> None:
        """Remove the hooks (a graph kept alive afterwards no longer calls back)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _reached(self, grad: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            run_when_backward_ends(self._ended)

    def _ended(self) -> None:
        self._queued = False
        self.callback()
