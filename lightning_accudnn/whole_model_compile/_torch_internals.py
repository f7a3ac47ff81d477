"""Every use of a private PyTorch name the whole-model route adds, in one place (the backends
``torch.compile(backend="inductor")`` and ``backend="aot_eager"`` are made of these)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx

__all__ = [
    "caches_bypassed",
    "compile_with_aot_eager",
    "compile_with_inductor",
    "functorch_options",
    "is_recompile_limit_error",
    "offload_copy_name",
    "recompile_limit",
    "recompile_limit_raises",
]


def compile_with_inductor(gm: fx.GraphModule, example_inputs: Any, partitioner: Any) -> Callable[..., Any]:
    """What ``backend="inductor"`` does, with ``partitioner`` as Inductor's ``custom_partitioner_fn``
    (``torch._inductor.compile_fx.compile_fx`` with that config patched)."""
    from torch._inductor.compile_fx import compile_fx

    compiled = compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": partitioner})
    assert callable(compiled)
    return compiled


def compile_with_aot_eager(gm: fx.GraphModule, example_inputs: Any, partitioner: Any) -> Callable[..., Any]:
    """What ``backend="aot_eager"`` does (AOTAutograd, no kernel compiler), with ``partitioner``
    as its partition function."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def run_as_traced(graph: fx.GraphModule, _inputs: Any) -> Callable[..., Any]:
        return make_boxed_func(graph.forward)

    backend = aot_autograd(fw_compiler=run_as_traced, bw_compiler=run_as_traced, partition_fn=partitioner)
    compiled: Callable[..., Any] = backend(gm, example_inputs)
    return compiled


@contextmanager
def functorch_options(options: dict[str, bool]) -> Iterator[None]:
    """``torch._functorch.config`` patched with ``options`` (the offload pass's flags) inside."""
    with torch._functorch.config.patch(options):
        yield


@contextmanager
def caches_bypassed() -> Iterator[None]:
    """Inductor's and AOTAutograd's caches neither read nor written inside
    (``torch.compiler.config.force_disable_caches``, a public flag set through its config module)."""
    with torch.compiler.config.patch(force_disable_caches=True):  # type: ignore[attr-defined]
        yield


def offload_copy_name(activation: str) -> str:
    """The name PyTorch's offload pass gives the host copy of the forward node ``activation``
    (``activation_offloading.CPU_OFFLOAD_PREFIX``), which the forward graph saves instead."""
    from torch._functorch._activation_offloading.activation_offloading import CPU_OFFLOAD_PREFIX

    return f"{CPU_OFFLOAD_PREFIX}{activation}"


@contextmanager
def recompile_limit_raises() -> Iterator[None]:
    """Inside, a frame that reaches Dynamo's recompile limit raises instead of running
    uncompiled (``torch._dynamo.config.fail_on_recompile_limit_hit``)."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def recompile_limit() -> int:
    """How many graphs Dynamo keeps for one frame (``torch._dynamo.config.recompile_limit``)."""
    limit: int = torch._dynamo.config.recompile_limit
    return limit


def is_recompile_limit_error(error: BaseException) -> bool:
    """Whether ``error`` is what :func:`recompile_limit_raises` makes Dynamo raise."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    return isinstance(error, FailOnRecompileLimitHit)
