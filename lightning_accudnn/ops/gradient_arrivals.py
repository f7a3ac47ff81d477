"""The parameters' gradients a backward has still to make, counted down as they arrive."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["GradientArrivals"]


class GradientArrivals:
    """Bytes of the gradients of ``parameters`` not made yet: those of the trainable parameters
    whose ``.grad`` is ``None`` when it is made (each storage once), each counted off at its
    first accumulation (PyTorch's post-accumulate-grad hook, which runs once the ``.grad`` is
    set). The model state a step counts holds every gradient; until the backward makes one, the
    device does not (:mod:`.working_memory`). :meth:`close` removes the hooks.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(4, 2)  # 10 fp32 parameters
        >>> arrivals = GradientArrivals(layer.parameters())
        >>> arrivals.to_come_bytes
        40
        >>> layer(torch.ones(1, 4)).sum().backward()
        >>> arrivals.to_come_bytes
        0
        >>> arrivals.close()
    """

    def __init__(self, parameters: Iterable[torch.Tensor]) -> None:
        self._pending: dict[int, int] = {}
        self._handles: list[RemovableHandle] = []
        seen: set[int] = set()
        for parameter in parameters:
            if not parameter.requires_grad or parameter.grad is not None or parameter.device.type == "meta":
                continue
            storage = parameter.untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            self._pending[id(parameter)] = storage.nbytes()
            hook = parameter.register_post_accumulate_grad_hook(self._arrived)  # type: ignore[no-untyped-call]
            self._handles.append(hook)
        self.to_come_bytes = sum(self._pending.values())

    def _arrived(self, parameter: torch.Tensor) -> None:
        self.to_come_bytes -= self._pending.pop(id(parameter), 0)

    def close(self) -> None:
        """Remove the hooks (the count stays as it is)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
