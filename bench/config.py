"""What a benchmark run is asked to do: the rows to run and how every row trains.

Example:
    >>> StrategySpec("accudnn-2x", "accudnn", {"reduction": 2}).kind
    'accudnn'
    >>> RunConfig(device=torch.device("cpu")).warmup
    3
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class StrategySpec:
    """One row to run: its name, the strategy kind and the kind's parameters.

    Example:
        >>> StrategySpec("accudnn-2x", "accudnn", {"reduction": 2}).kind
        'accudnn'
    """

    name: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunConfig:
    """How every row of a run trains: device, steps, seed, AccUDNN and compile options.

    ``warmup`` steps run before the ``steps`` that are measured (AccUDNN's first step
    profiles and its second re-plans from its own timings, so at least 2 warm-up steps
    reach its steady state); a technique that has not settled by then (a plan still being
    refined) warms up longer, up to ``warmup`` steps more. ``distinct_batches`` batches are
    cycled.

    Example:
        >>> RunConfig(device=torch.device("cpu")).warmup
        3
    """

    device: torch.device
    warmup: int = 3
    steps: int = 10
    seed: int = 0
    distinct_batches: int = 2
    min_swap_bytes: int | None = None
    reserve_bytes: int | None = None
    host_memory_limit: str | None = None
    compile_backend: str = "inductor"
