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

from dataclasses import dataclass

import torch
from torch import nn

from bench.overhead.models import deep_narrow
from lightning_accudnn.ops import OffloadEngine, Runtime, StepStats, SwapSchedule

VARIANTS = ("keep", "half")


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
        engine = self.engines[variant]
        with engine.offload(self.model, self.schedules[variant], sequence=self.profiles[variant].sequence):
            loss = self.model(self.batch).sum()
        loss.backward()
        result = engine.end_step()
        assert result is not None
        return result

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
