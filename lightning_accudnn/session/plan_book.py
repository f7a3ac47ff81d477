"""Plans remembered per distinct training pass: which batch shape, which pass of the step.

A training step may hold several forward/backward passes (a GAN's generator and
discriminator under manual optimization) and batches of several shapes (the short last
batch of an epoch). Each pass keeps its own plan, found again by a :class:`PassKey` before
its forward runs; after the pass the measured layer sequence is compared with the plan's,
so a pass whose graph changed anyway is re-planned from its own measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.session._torch_internals import tensor_leaves

__all__ = ["PassKey", "PlanBook", "batch_signature", "layers_differ"]

BatchSignature = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def batch_signature(batch: Any) -> BatchSignature:
    """Shapes and dtypes of the tensors in ``batch`` (any nesting of lists, tuples, dicts).

    Example:
        >>> batch_signature({"x": torch.zeros(8, 3), "y": [torch.zeros(8, dtype=torch.long), "id"]})
        (((8, 3), torch.float32), ((8,), torch.int64))
    """
    return tuple((tuple(leaf.shape), leaf.dtype) for leaf in tensor_leaves(batch))


@dataclass(frozen=True)
class PassKey:
    """One distinct pass: the model it trains, the batch's shapes and its position in the step.

    Example:
        >>> PassKey(model=1, batch=(((8, 3), torch.float32),), position=0).position
        0
    """

    model: int
    batch: BatchSignature
    position: int


@dataclass
class _Entry:
    plan: Plan
    refined: bool  # re-planned once from a planned pass's own timings


class PlanBook:
    """The plan of every pass seen so far, and whether it has been refined.

    Example:
        >>> book = PlanBook()
        >>> key = PassKey(0, (), 0)
        >>> book.plan(key) is None, book.needs_refining(key)
        (True, False)
    """

    def __init__(self) -> None:
        self._entries: dict[PassKey, _Entry] = {}

    def plan(self, key: PassKey) -> Plan | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.plan

    def needs_refining(self, key: PassKey) -> bool:
        """True while the pass has a plan made from a profiling pass's distorted timings."""
        entry = self._entries.get(key)
        return entry is not None and not entry.refined

    def keep(self, key: PassKey, plan: Plan, *, refined: bool) -> None:
        self._entries[key] = _Entry(plan, refined)

    def passes(self) -> list[PassKey]:
        """The passes with a plan, in the order they were first seen."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def layers_differ(old: StepProfile, new: StepProfile) -> bool:
    """True when the two profiles saw different layer invocations or sizes (the graph changed).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> a = StepProfile((LayerProfile("x", 10, 10),), static_bytes=0)
        >>> layers_differ(a, StepProfile((LayerProfile("x", 20, 20),), static_bytes=0))
        True
    """
    return [(layer.name, layer.saved_bytes) for layer in old.layers] != [
        (layer.name, layer.saved_bytes) for layer in new.layers
    ]
