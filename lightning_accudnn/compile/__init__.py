"""Experimental: a per-layer plan applied inside ``torch.compile``'s partitioner (whole-model compile).

Tested with PyTorch 2.14.1 only; it relies on AOTAutograd's activation-offloading pass and on
Inductor's ``custom_partitioner_fn``, both marked experimental upstream. See
:mod:`lightning_accudnn.compile.partitioner`.

Imports torch, ``planner`` and ``lightning_accudnn.profile`` only.
"""

from lightning_accudnn.compile.partitioner import *  # noqa: F403 (its public names, listed once there)
from lightning_accudnn.compile.partitioner import __all__ as __all__
