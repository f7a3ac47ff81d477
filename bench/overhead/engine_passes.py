"""Engine-only passes of the deep narrow model: profiled once, then replayed by ordinal.

What :mod:`bench.overhead.bytecodes` and :mod:`bench.overhead.hostprofile` measure: the same
model through :class:`OffloadEngine` alone (no Lightning), keeping everything or with the first
half of its saving layers swapped, each on its own engine whose route is compiled (the steady
state).

Example:
    >>> passes = EnginePasses.deep_narrow(torch.device("cpu"), layers=4)
    >>> passes.run("half").storages_swapped_out > 0
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from bench.overhead.models import deep_narrow
from lightning_accudnn.ops import OffloadEngine, Runtime, StepStats, SwapSchedule

VARIANTS = ("keep", "half")
#: The phases of a pass :meth:`EnginePasses.run_phases` times: the forward pass (the pack hooks),
#: the end of the forward block (hooks removed, the first prefetch round), the backward pass (the
#: unpack hooks and the prefetch rounds they start) and :meth:`~OffloadEngine.end_step`.
PHASES = ("forward", "forward_end", "backward", "end_step")


@dataclass
class EnginePasses:
    """A model, its batch, and per variant an engine, its profiled pass and its schedule."""

    model: nn.Module
    batch: torch.Tensor
    engines: dict[str, OffloadEngine]
    profiles: dict[str, StepStats]
    schedules: dict[str, SwapSchedule]

    @classmethod
    def deep_narrow(
        cls,
        device: torch.device,
        layers: int = 333,
        runtimes: dict[str, Runtime] | None = None,
        *,
        tight: bool = False,
    ) -> EnginePasses:
        """Profile the deep narrow model on ``device`` once per variant (``runtimes``: each
        variant's runtime, else the device's own), then run each variant twice: the steady state.
        ``tight``: the half-swapped schedule's window and copy-out limit are one layer's bytes."""
        torch.manual_seed(0)
        workload = deep_narrow(layers=layers)
        model = workload.build().to(device)
        batch = workload.make_batch(0)[0].to(device)
        engines, profiles = {}, {}
        for variant in VARIANTS:
            runtime = None if runtimes is None else runtimes[variant]
            engine = OffloadEngine(device, min_swap_bytes=0, runtime=runtime)
            with engine.offload(model, SwapSchedule.keep_everything()):
                loss = model(batch).sum()
            loss.backward()
            stats = engine.end_step()
            assert stats is not None
            engines[variant], profiles[variant] = engine, stats
        swapped = profiles["half"].layers[: len(profiles["half"].layers) // 2]
        names = [layer.name for layer in swapped]
        layer_bytes = max(layer.swappable_bytes for layer in swapped)
        window, copying_out = (layer_bytes, layer_bytes) if tight else (2**30, 64 * 1024)
        schedules = {
            "keep": SwapSchedule.keep_everything(),
            "half": SwapSchedule.swap_layers_named(names, window, copying_out),
        }
        passes = cls(model, batch, engines, profiles, schedules)
        for _ in range(2):
            for variant in VARIANTS:
                passes.run(variant)
        return passes

    def run(self, variant: str) -> StepStats:
        """One replayed pass of ``variant`` (forward, backward, end of step)."""
        return self.run_phases(variant)[0]

    def run_phases(self, variant: str) -> tuple[StepStats, dict[str, float]]:
        """One replayed pass of ``variant`` and the host seconds of its phases (see :data:`PHASES`).

        The host's clock only: on a GPU the device is not synchronised between phases, so a
        phase's figure is the time the host spent issuing it."""
        engine = self.engines[variant]
        clock = time.perf_counter
        start = clock()
        with engine.offload(self.model, self.schedules[variant], sequence=self.profiles[variant].sequence):
            loss = self.model(self.batch).sum()
            forward_done = clock()
        backward_start = clock()
        loss.backward()
        backward_done = clock()
        result = engine.end_step()
        ended = clock()
        assert result is not None
        seconds = (forward_done - start, backward_start - forward_done, backward_done - backward_start)
        return result, dict(zip(PHASES, (*seconds, ended - backward_done), strict=True))

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
