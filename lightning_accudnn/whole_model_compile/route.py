"""The experimental whole-model route: a model compiled whole, planned inside its compiled graph.

With ``OffloadConfig(whole_model_compile="experimental")`` a model compiled whole
(``torch.compile(model)``, ``model.compile()``, ``LightningModule.compile()``) is not refused:

1. Its first pass (the trial) runs it compiled again, with every activation PyTorch's offload
   pass can move offloaded (the safest mode, as the eager route's profiling pass), and records
   per layer the bytes the forward graph saves and those the pass took (the compile caches are
   bypassed, so the partitioner always runs).
2. At the end of that forward the session plans from them, with the same planner, budget and
   reserve as every route; a budget too small is refused there, before backward and before
   any optimizer step.
3. The following passes run the model compiled with the plan's backend: its partitioner tags
   the forward nodes of each swapped layer for PyTorch's activation-offloading pass. A changed
   plan compiles again; a plan seen before reuses its compiled graph (Dynamo keeps one per
   backend object) or Inductor's caches (keyed by a hash of the plan).

The model is compiled with ``config.whole_model_backend`` forced for its forward
(``torch.compiler.set_stance("default", force_backend=...)``): the backend and options it
was compiled with are not used inside the session's passes (``fullgraph`` and ``dynamic``
are). The engine's saved-tensor hooks do not run on this route, so no per-pass figures
(``OffloadStats``) are measured, and the plan made from the first pass serves every later
batch shape.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.profile import ROOT_LAYER, StepProfile
from lightning_accudnn.session.patterns import UnmatchedPatternError
from lightning_accudnn.whole_model_compile._torch_internals import (
    is_recompile_limit_error,
    recompile_limit,
    recompile_limit_raises,
)
from lightning_accudnn.whole_model_compile.backend import PlanBackend
from lightning_accudnn.whole_model_compile.partitioner import (
    TRIAL_PLAN,
    Partition,
    PlanPartitioner,
    plan_choices,
    profile_of,
)

__all__ = ["WholeModelRoute", "kept_layers"]


class WholeModelRoute:
    """How one model compiled whole is compiled in the session's passes: trial, then planned.

    Example:
        >>> from torch import nn
        >>> from lightning_accudnn.planner.plan import plan_swaps
        >>> blocks = [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)]
        >>> model = torch.compile(nn.Sequential(*blocks))
        >>> route = WholeModelRoute("aot_eager", accelerator=False)
        >>> with route.compiled():  # the trial
        ...     loss = model(torch.randn(32, 64)).sum()
        >>> profile = route.trial_profile(static_bytes=0, min_swap_bytes=0)
        >>> [layer.name for layer in profile.layers]
        ['0.1', '1.1', '2.1', '(root)']
        >>> plan = plan_swaps(profile, budget_bytes=profile.unconstrained_peak_bytes - 1)
        >>> route.apply(plan)
        >>> with route.compiled():  # compiled again, with the plan
        ...     loss = model(torch.randn(32, 64)).sum()
        >>> sorted(route.partitions()[0].offloaded) == sorted(plan.swapped_layers) == ['0.1', '1.1', '2.1']
        True
    """

    def __init__(self, compiler: str, *, accelerator: bool) -> None:
        self.compiler = compiler
        self.accelerator = accelerator
        self.trial = PlanBackend(PlanPartitioner(TRIAL_PLAN), compiler, accelerator=accelerator, cached=False)
        self.backend = self.trial
        self._backends: dict[str, PlanBackend] = {}  # one per plan (its partitioner's uuid)

    @classmethod
    def started(
        cls, form: str, compiler: str, *, accelerator: bool, report: Callable[[str], None]
    ) -> WholeModelRoute:
        """The route for a model compiled whole (``form`` says how), announced through ``report``."""
        report(
            f"accudnn: {form}: planned inside its compiled graph (whole_model_compile='experimental'); "
            f"training passes compile it with {compiler} and the plan's partitioner, not with the backend "
            "and options it was compiled with; the first pass measures what the graph saves"
        )
        return cls(compiler, accelerator=accelerator)

    @property
    def planned(self) -> bool:
        """Whether a plan was applied (the passes no longer run the trial)."""
        return self.backend is not self.trial

    @contextmanager
    def compiled(self) -> Iterator[None]:
        """Inside, the model compiles (or finds compiled) with the current plan's backend.

        Dynamo keeps every graph compiled for a frame (one per plan's backend, in every session
        of the process) up to its recompile limit; past it, the forward raises here rather
        than run uncompiled, without the plan.
        """
        with torch.compiler.set_stance("default", force_backend=self.backend), recompile_limit_raises():
            try:
                yield
            except Exception as error:
                if not is_recompile_limit_error(error):
                    raise
                raise RuntimeError(
                    "whole_model_compile='experimental': Dynamo reached its recompile limit "
                    f"(torch._dynamo.config.recompile_limit, {recompile_limit()}) for the "
                    "model's forward. The route compiles it once for its trial and once per plan, in every "
                    "session of this process, and Dynamo keeps each graph: call torch.compiler.reset() "
                    "before a new session trains the model, or raise the limit."
                ) from error

    def partitions(self) -> list[Partition]:
        """What the current backend's partitioner did, one entry per graph it compiled (none
        when the plan's graphs came from a cache)."""
        return self.backend.partitioner.partitions

    def trial_profile(
        self, static_bytes: int, min_swap_bytes: int, keep_on_device: Sequence[str] = ()
    ) -> StepProfile:
        """The trial's saved bytes per layer (over every graph it compiled), as a profile: a
        layer can swap what the offload pass took from it, unless ``keep_on_device`` names it
        (or a module it is in)."""
        graphs = self.trial.partitioner.partitions
        if not graphs:
            raise RuntimeError(
                "whole_model_compile='experimental': the first pass compiled no training graph of the "
                "model (nothing ran compiled, or without gradients), so there is nothing to plan from. "
                "Call the compiled model inside the session's step with gradients enabled."
            )
        merged = Partition()
        for graph in graphs:
            for layer, nbytes in graph.saved_bytes.items():
                merged.saved_bytes[layer] = merged.saved_bytes.get(layer, 0) + nbytes
            for layer, nbytes in graph.offloaded_bytes.items():
                merged.offloaded_bytes[layer] = merged.offloaded_bytes.get(layer, 0) + nbytes
        profile = profile_of(merged, static_bytes, min_swap_bytes)
        kept = kept_layers(keep_on_device, [layer.name for layer in profile.layers])
        layers = tuple(
            replace(layer, swappable_bytes=0) if layer.name in kept else layer for layer in profile.layers
        )
        return replace(profile, layers=layers)

    def plan_from_trial(
        self,
        static_bytes: int,
        min_swap_bytes: int,
        keep_on_device: Sequence[str],
        make_plan: Callable[[StepProfile], Plan],
    ) -> Plan:
        """After the trial forward: plan with ``make_plan`` from what its graph saves (a budget too
        small is refused there, before backward), and compile with the plan from the next pass."""
        plan = make_plan(self.trial_profile(static_bytes, min_swap_bytes, keep_on_device))
        self.apply(plan)
        return plan

    def apply(self, plan: Plan) -> None:
        """The following passes compile with ``plan`` (again only when it differs from those seen)."""
        partitioner = PlanPartitioner(plan_choices(plan))
        backend = self._backends.get(partitioner.uuid())
        if backend is None:
            backend = PlanBackend(partitioner, self.compiler, accelerator=self.accelerator)
            self._backends[partitioner.uuid()] = backend
        self.backend = backend


def kept_layers(patterns: Sequence[str], layers: Sequence[str]) -> set[str]:
    """The ``layers`` that ``patterns`` (``fnmatch``) name, by their own module name or one they
    are in; a pattern that names none raises :class:`UnmatchedPatternError`.

    Example:
        >>> sorted(kept_layers(["blocks.1"], ["stem", "blocks.0.up", "blocks.1.up", "blocks.1", "(root)"]))
        ['blocks.1', 'blocks.1.up']
        >>> kept_layers(["block.1"], ["blocks.1.up"])
        Traceback (most recent call last):
        ...
        lightning_accudnn.session.patterns.UnmatchedPatternError: keep_on_device pattern 'block.1' names no \
module the compiled graph saves activations for (those modules and the modules they are in: 'blocks', \
'blocks.1', 'blocks.1.up')
    """
    modules = {
        name: {".".join(name.split(".")[:end]) for end in range(1, name.count(".") + 2)}
        for name in layers
        if name.split("#", 1)[0] != ROOT_LAYER  # the step's own code, in one stretch or several
    }
    kept: set[str] = set()
    for pattern in patterns:
        named = {
            layer for layer, owners in modules.items() if any(fnmatch.fnmatchcase(o, pattern) for o in owners)
        }
        if not named:
            known = sorted(set().union(*modules.values()))
            raise UnmatchedPatternError(
                f"keep_on_device pattern {pattern!r} names no module the compiled graph saves activations "
                f"for (those modules and the modules they are in: {', '.join(repr(name) for name in known)})"
            )
        kept |= named
    return kept
