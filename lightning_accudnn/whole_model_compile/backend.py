"""A ``torch.compile`` backend per plan: how the whole-model route compiles a model with its plan.

Dynamo keeps a model's compiled graphs per backend object, so one :class:`PlanBackend` per
plan, forced for the model's forward with ``torch.compiler.set_stance("default",
force_backend=backend)``, compiles the model again when the plan changes and reuses the
graph compiled for a plan seen before. Below Dynamo, Inductor's and AOTAutograd's caches are
keyed by the partitioner's ``uuid()`` (a hash of the plan), so an unchanged plan is served
from them across processes too.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import fx

from lightning_accudnn.profile import LayerChoice
from lightning_accudnn.whole_model_compile._torch_internals import (
    caches_bypassed,
    compile_with_aot_eager,
    compile_with_inductor,
    functorch_options,
)
from lightning_accudnn.whole_model_compile.partitioner import (
    TESTED_TORCH_VERSIONS,
    PlanPartitioner,
    offloading_options,
)

__all__ = ["COMPILERS", "PlanBackend", "check_torch_version"]

#: The compilers the whole-model route compiles with: Inductor (``torch.compile``'s default)
#: or AOTAutograd alone (``"aot_eager"``: no kernels, the traced graphs run as they are).
COMPILERS = ("inductor", "aot_eager")


def check_torch_version(version: str | None = None) -> None:
    """Raise ``RuntimeError`` unless PyTorch ``version`` (default: the one running) is one the
    whole-model route was tested with.

    Example:
        >>> check_torch_version("2.14.1+cu130")
        >>> check_torch_version("2.13.0")
        Traceback (most recent call last):
        ...
        RuntimeError: whole_model_compile='experimental' was tested with PyTorch 2.14.1 only (it relies on \
PyTorch's experimental activation-offloading pass and Inductor's custom_partitioner_fn), this is PyTorch \
2.13.0: install a tested version, or compile the model's blocks one by one (regional compilation, supported)
    """
    version = torch.__version__ if version is None else version
    if version.split("+")[0] not in TESTED_TORCH_VERSIONS:
        raise RuntimeError(
            f"whole_model_compile='experimental' was tested with PyTorch {', '.join(TESTED_TORCH_VERSIONS)} "
            "only (it relies on PyTorch's experimental activation-offloading pass and Inductor's "
            f"custom_partitioner_fn), this is PyTorch {version}: install a tested version, or compile the "
            "model's blocks one by one (regional compilation, supported)"
        )


class PlanBackend:
    """A ``torch.compile`` backend: ``compiler`` (one of :data:`COMPILERS`) with ``partitioner``.

    While the partitioner runs, PyTorch's offload pass is on when the plan swaps a layer
    (:func:`~lightning_accudnn.whole_model_compile.partitioner.offloading_options`, its stream and
    prefetch flags with ``accelerator``). ``cached=False`` bypasses Inductor's and
    AOTAutograd's caches, so that the partitioner runs on every compile (a trial partition
    measures the graph; a cache hit would skip it).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> backend = PlanBackend(PlanPartitioner({"0": LayerChoice.SWAP}), "aot_eager")
        >>> torch.compile(model, backend=backend)(torch.randn(2, 4)).sum().backward()
        >>> list(backend.partitioner.partitions[0].offloaded)
        ['0']
    """

    def __init__(
        self,
        partitioner: PlanPartitioner,
        compiler: str = "inductor",
        *,
        accelerator: bool = False,
        cached: bool = True,
    ) -> None:
        if compiler not in COMPILERS:
            raise ValueError(
                f"the whole-model route compiles with one of {', '.join(COMPILERS)}, got {compiler!r}"
            )
        self.partitioner = partitioner
        self.compiler = compiler
        self.accelerator = accelerator
        self.cached = cached

    def __call__(self, gm: fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        swaps = LayerChoice.SWAP in self.partitioner.plan.values()
        offloading = (
            functorch_options(offloading_options(accelerator=self.accelerator)) if swaps else nullcontext()
        )
        caches = nullcontext() if self.cached else caches_bypassed()
        with offloading, caches:
            if self.compiler == "inductor":
                return compile_with_inductor(gm, example_inputs, self.partitioner)
            return compile_with_aot_eager(gm, example_inputs, self.partitioner)
