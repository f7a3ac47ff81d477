"""The losses a traced step may end with: what its backward starts from, and what it holds.

:func:`~.trace.trace_step` knows no model's own loss: it ends the step with :func:`step_loss`
(the mean of the outputs) or :func:`cross_entropy_loss` (over the logits, as a classifier or a
language model does), named in :data:`LOSSES`.

Example:
    >>> sorted(LOSSES)
    ['cross-entropy', 'mean']
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

__all__ = ["LOSSES", "cross_entropy_loss", "step_loss"]


def cross_entropy_loss(output: object) -> torch.Tensor:
    """A cross-entropy over the classes of the first floating-point output that requires grad
    (the logits, classes in the last dimension: ``(batch, classes)`` or ``(batch, tokens,
    vocabulary)``), every target class 0: what a classifier's or a language model's step
    holds for its loss (under mixed precision, CUDA autocast computes it in float32).

    Example:
        >>> logits = torch.zeros(2, 3, 4, requires_grad=True)
        >>> round(cross_entropy_loss({"logits": logits}).item(), 4)  # log(4)
        1.3863
    """
    logits = _floating_outputs(output)[0]
    if logits.dim() < 2:
        raise ValueError(
            f"a cross-entropy needs logits with a class dimension last, got an output of shape "
            f"{tuple(logits.shape)}: trace with the mean loss instead"
        )
    flat = logits.flatten(0, -2)
    return F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long))


def _floating_outputs(output: object) -> list[torch.Tensor]:
    tensors = [
        t
        for t in tree_flatten(output)[0]
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]
    if not tensors:
        raise ValueError(
            "the model returned no floating-point tensor that requires grad: nothing to backpropagate"
        )
    return tensors


def step_loss(output: object) -> torch.Tensor:
    """The loss a traced step backpropagates: the mean, in float32, of every floating-point
    output that requires grad, summed (a model's own loss is not known to the trace).

    Example:
        >>> x = torch.ones(2, 3, requires_grad=True)
        >>> step_loss((x, {"aux": 2 * x, "ids": torch.zeros(2, dtype=torch.long)})).item()
        3.0
    """
    tensors = _floating_outputs(output)
    total = tensors[0].float().mean()
    for tensor in tensors[1:]:
        total = total + tensor.float().mean()
    return total


#: The losses a traced step may end with (:func:`trace_step`'s ``loss``).
LOSSES: dict[str, Callable[[object], torch.Tensor]] = {"mean": step_loss, "cross-entropy": cross_entropy_loss}
