"""A real CPU step's saves per layer, counted independently of the trace."""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker


def real_saved_by_layer(
    model: nn.Module,
    batch: torch.Tensor,
    *,
    autocast: torch.dtype | None = None,
    only: torch.dtype | None = None,
) -> dict[str, int]:
    """Saved bytes per layer in a real CPU step (under CPU autocast to ``autocast``, if given),
    counted independently of the trace: storages identified by data pointer, parameters and
    buffers skipped, each storage once; with ``only``, the storages of that dtype alone."""
    tracker = LayerTracker()
    model_ptrs = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    keep: list[torch.Tensor] = []
    saved: dict[str, int] = defaultdict(int)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in model_ptrs and pointer not in seen:
            seen.add(pointer)
            keep.append(tensor)
            if only is None or tensor.dtype == only:
                saved[tracker.current] += tensor.untyped_storage().nbytes()
        return tensor

    precision = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with tracker.attached(model), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), precision:
        loss = model(batch).float().mean()
    loss.backward()
    return {layer: nbytes for layer, nbytes in saved.items() if nbytes}
