"""Experimental: a per-layer plan applied inside ``torch.compile``'s partitioner (whole-model compile).

Tested with PyTorch 2.14.1 only; it relies on AOTAutograd's activation-offloading pass and on
Inductor's ``custom_partitioner_fn``, both marked experimental upstream. See
:mod:`lightning_accudnn.compile.partitioner` (the plan as tags in the joint graph) and
:mod:`lightning_accudnn.compile.backend` (a ``torch.compile`` backend per plan); the session
switches the route on with ``OffloadConfig(whole_model_compile="experimental")``.

Imports torch, ``planner`` and ``lightning_accudnn.profile`` only.
"""

from lightning_accudnn.compile.backend import *  # noqa: F403 (its public names, listed once there)
from lightning_accudnn.compile.backend import __all__ as _backend_names
from lightning_accudnn.compile.partitioner import *  # noqa: F403 (its public names, listed once there)
from lightning_accudnn.compile.partitioner import __all__ as _partitioner_names

__all__ = [*_backend_names, *_partitioner_names]
