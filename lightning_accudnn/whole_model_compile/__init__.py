"""Experimental: a model compiled whole, planned inside its compiled graph (the whole-model route).

Everything the route is made of lives here; the session turns it on with
``OffloadConfig(whole_model_compile="experimental")`` and otherwise only enters it:

* :mod:`~lightning_accudnn.whole_model_compile.partitioner`: the plan as tags in AOTAutograd's
  joint graph (an Inductor ``custom_partitioner_fn``), and the trial partition's profile;
* :mod:`~lightning_accudnn.whole_model_compile.backend`: a ``torch.compile`` backend per plan;
* :mod:`~lightning_accudnn.whole_model_compile.route`: :class:`WholeModelRoute`, how one model
  compiled whole is compiled in the session's passes (trial, then planned).

Tested with PyTorch 2.14.1 only; it relies on AOTAutograd's activation-offloading pass and on
Inductor's ``custom_partitioner_fn``, both marked experimental upstream. Models whose blocks
are compiled one by one (regional compilation) do not take this route: the engine plans them
per compiled block (:mod:`lightning_accudnn.session.compiled`).

Imports torch, ``planner``, ``lightning_accudnn.profile`` and the session's pattern errors only;
importing it imports Dynamo, so the session imports it only when the option is set.
"""

from lightning_accudnn.whole_model_compile.backend import *  # noqa: F403 (its public names, listed once there)
from lightning_accudnn.whole_model_compile.backend import __all__ as _backend_names
from lightning_accudnn.whole_model_compile.partitioner import *  # noqa: F403 (its public names, listed once there)
from lightning_accudnn.whole_model_compile.partitioner import __all__ as _partitioner_names
from lightning_accudnn.whole_model_compile.route import *  # noqa: F403 (its public names, listed once there)
from lightning_accudnn.whole_model_compile.route import __all__ as _route_names

__all__ = [*_backend_names, *_partitioner_names, *_route_names]
