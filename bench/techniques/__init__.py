"""The ways of keeping activation memory down that a benchmark row can run, one module each.

* ``oracle``: :class:`Technique` itself, nothing done;
* ``accudnn``: :class:`AccUDNN`, lightning-accudnn's session as ``AccUDNNStrategy`` drives it;
* ``capped``: :class:`Capped`, no offload under the CUDA allocator cap AccUDNN sets;
* ``save_on_cpu``: :class:`SaveOnCpu`, ``torch.autograd.graph.save_on_cpu``;
* ``torchtune``: :class:`TorchtuneOffload`, torchtune's ``OffloadActivations``;
* ``checkpoint``: :class:`Checkpoint`, every block under ``torch.utils.checkpoint``;
* ``compile``: :class:`Compile`, ``torch.compile`` with an activation memory budget.

Example:
    >>> import torch
    >>> from bench.config import RunConfig, StrategySpec
    >>> from bench.workloads import tiny
    >>> workload = tiny()
    >>> technique = make_technique(StrategySpec("ckpt", "checkpoint"), workload.build(), workload,
    ...                            RunConfig(torch.device("cpu")))
    >>> type(technique).__name__
    'Checkpoint'
"""

from __future__ import annotations

from torch import nn

from bench.config import RunConfig, StrategySpec
from bench.techniques.accudnn import AccUDNN
from bench.techniques.base import Technique
from bench.techniques.capped import Capped
from bench.techniques.checkpoint import Checkpoint, checkpoint_blocks
from bench.techniques.compiled import Compile
from bench.techniques.save_on_cpu import SaveOnCpu
from bench.techniques.torchtune_offload import TorchtuneOffload
from bench.workloads import Workload

__all__ = [
    "AccUDNN",
    "Capped",
    "Checkpoint",
    "Compile",
    "SaveOnCpu",
    "Technique",
    "TorchtuneOffload",
    "budget_of",
    "checkpoint_blocks",
    "make_technique",
]


def budget_of(spec: StrategySpec) -> int | None:
    """The byte budget a row runs under (``accudnn`` and ``capped`` rows), ``None`` for the others.

    Example:
        >>> budget_of(StrategySpec("a", "accudnn", {"budget_bytes": 10}))
        10
        >>> budget_of(StrategySpec("o", "oracle")) is None
        True
    """
    if spec.kind not in ("accudnn", "capped"):
        return None
    return _required_budget(spec)


def _required_budget(spec: StrategySpec) -> int:
    budget = spec.params.get("budget_bytes")
    if budget is None:
        raise ValueError(f"an {spec.kind} row needs budget_bytes")
    return int(budget)


def make_technique(spec: StrategySpec, model: nn.Module, workload: Workload, config: RunConfig) -> Technique:
    """The technique of ``spec``'s kind, built for ``model`` and ``config``."""
    kind, params = spec.kind, spec.params
    if kind == "checkpoint":
        return Checkpoint(workload.blocks(model))
    if kind == "oracle":
        return Technique()
    if kind == "accudnn":
        return AccUDNN(_required_budget(spec), config, policy=params.get("policy", "auto"))
    if kind == "capped":
        return Capped(_required_budget(spec))
    if kind == "save_on_cpu":
        return SaveOnCpu(pin_memory=params.get("pin_memory", True))
    if kind == "torchtune":
        return TorchtuneOffload()
    if kind == "compile":
        return Compile(
            float(params["activation_memory_budget"]), params.get("backend", config.compile_backend)
        )
    raise ValueError(f"unknown strategy kind {kind!r}")
