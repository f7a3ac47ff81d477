"""``AccUDNNDDPStrategy``: Lightning's DDP with activation swapping under a budget on every rank."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy

from lightning_accudnn.ops import Runtime
from lightning_accudnn.planner.budget import Budget
from lightning_accudnn.session import DistributedCoordinator, OffloadConfig
from lightning_accudnn.session.config import option_names
from lightning_accudnn.session.coordination import RankCoordinator
from lightning_accudnn.session.rank_failure import RankFailureWatch
from lightning_accudnn.strategy.offload_hooks import OffloadHooks, offload_config


class AccUDNNDDPStrategy(OffloadHooks, DDPStrategy):
    """DDP where every rank swaps saved activations so its step fits ``budget``.

    Each rank profiles its own device; the ranks then plan from one merged profile (the
    largest bytes and times, the slowest host link), so every rank runs the same plan and
    none waits for a slower one at the gradient all-reduce. Offload options are those of
    :class:`~lightning_accudnn.AccUDNNStrategy` (``config=`` and/or the
    :class:`~lightning_accudnn.OffloadConfig` field names); every other keyword goes to
    Lightning's ``DDPStrategy`` (``find_unused_parameters``, ``static_graph``,
    ``gradient_as_bucket_view``, ``start_method``, ...). Multi-node runs work as Lightning's
    DDP does. ``runtime`` is as for :class:`~lightning_accudnn.AccUDNNStrategy` (one per rank).
    The experimental whole-model compile route (``whole_model_compile``) is refused here.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(accelerator="cpu", devices=2, strategy=AccUDNNDDPStrategy(budget="2GB"))
    """

    strategy_name = "accudnn_ddp"
    #: A retried forward would repeat DDP's collectives (buffer broadcast) on one rank only:
    #: an out-of-memory error ends the run on every rank instead.
    retries_out_of_memory = False

    def __init__(
        self,
        budget: Budget | int | str | None = None,
        *,
        config: OffloadConfig | None = None,
        runtime: Runtime | None = None,
        **options: Any,
    ) -> None:
        offload_options = {name: options.pop(name) for name in option_names() if name in options}
        super().__init__(**options)
        self.offload_config = offload_config(config, budget, offload_options)
        if self.offload_config.whole_model_compile is not None:
            raise ValueError(
                "whole_model_compile='experimental' is served by AccUDNNStrategy and OffloadSession (one "
                "device) only, not under DDP (DDP splits a compiled model's graph at its gradient buckets, "
                "and the ranks do not agree on this route's plans yet): compile the model's blocks one by "
                "one (regional compilation) to train it compiled under AccUDNNDDPStrategy"
            )
        self.offload_runtime = runtime

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if self.offload is not None and self.model is not None:
            self.offload.count_gradient_buckets(self.model)  # the DDP wrapper, made by setup
        if self.failure_watch is None:
            self.failure_watch = RankFailureWatch(self.global_rank)
            self.failure_watch.start()

    def make_coordinator(self) -> RankCoordinator:
        return DistributedCoordinator()
