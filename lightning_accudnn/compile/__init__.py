"""Experimental: a per-layer plan applied inside ``torch.compile``'s partitioner (whole-model compile).

Tested with PyTorch 2.14.1 only; it relies on AOTAutograd's activation-offloading pass and on
Inductor's ``custom_partitioner_fn``, both marked experimental upstream. See
:mod:`lightning_accudnn.compile.partitioner`.

Imports torch, ``planner`` and ``lightning_accudnn.profile`` only.
"""

from lightning_accudnn.compile.partitioner import (
    PARTITIONER_VERSION,
    TESTED_TORCH_VERSIONS,
    Partition,
    PlanPartitioner,
    layer_of,
    module_path,
    offloading_options,
    plan_choices,
    profile_of,
)

__all__ = [
    "PARTITIONER_VERSION",
    "TESTED_TORCH_VERSIONS",
    "Partition",
    "PlanPartitioner",
    "layer_of",
    "module_path",
    "offloading_options",
    "plan_choices",
    "profile_of",
]
