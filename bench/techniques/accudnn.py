"""lightning-accudnn itself: the offload session ``AccUDNNStrategy`` drives, driven the same way.

Example:
    >>> from bench.config import RunConfig
    >>> technique = AccUDNN(2_000_000, RunConfig(torch.device("cpu")))
    >>> technique.plan is None
    True
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from bench.config import RunConfig
from bench.measure import StepMemory
from bench.techniques.base import Technique
from bench.workloads import Batch
from lightning_accudnn.planner import Plan
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.session import is_out_of_memory


class AccUDNN(Technique):
    """lightning-accudnn's session under ``budget_bytes`` (what ``AccUDNNStrategy`` runs)."""

    def __init__(self, budget_bytes: int, config: RunConfig, policy: str = "auto") -> None:
        min_swap = DEFAULT_MIN_SWAP_BYTES if config.min_swap_bytes is None else config.min_swap_bytes
        self.config = OffloadConfig(
            budget=budget_bytes,
            min_swap_bytes=min_swap,
            host_memory_limit=config.host_memory_limit,
            reserve_bytes=config.reserve_bytes,
            policy=policy,
        )
        self.session: OffloadSession | None = None
        self.device = config.device

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> nn.Module:
        self.teardown()
        self.session = OffloadSession(self.config, device)
        return model

    def _session(self) -> OffloadSession:
        if self.session is None:
            raise RuntimeError("prepare() makes the session before the first step")
        return self.session

    def forward_context(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch
    ) -> contextlib.AbstractContextManager:
        return self._session().step(model, [optimizer], batch=batch, close_on_backward=False)

    def recover(self, error: BaseException) -> bool:
        """An out-of-memory error is re-planned with a larger reserve and the step run again, as
        ``AccUDNNStrategy`` does (a few times in a row at most)."""
        return is_out_of_memory(error) and self._session().recover_from_out_of_memory(error)

    def release_failed_pass(self) -> None:
        self._session().release_failed_pass()

    def backward(self, loss: torch.Tensor) -> StepMemory | None:
        session = self._session()
        session.begin_backward()
        try:
            loss.backward()
        except BaseException:
            session.abort()
            raise
        stats = session.end_backward()
        if stats is None or self.device.type != "cuda":
            return None
        # end_step read the allocator's peak of forward and backward, then reset it.
        return StepMemory(stats.peak_device_bytes, stats.peak_reserved_bytes)

    def settled(self) -> bool:
        """Whether the session's last pass was not timed layer by layer, no pass it may make its
        plan again from is being timed whole (or read), and no plan made meanwhile on a planning
        thread replaces the one it ran: the next pass replays it. Plans in the making are waited
        for and adopted first, so that the next step runs them, as the step after the last timed
        one does when plans are made inline."""
        session = self._session()
        ran = session.plan
        session.wait_for_plans()
        stats = session.stats
        settled = stats is not None and not stats.timed and not stats.steady_timing
        return settled and session.plan is ran

    def step_figures(self) -> dict[str, Any]:
        stats = None if self.session is None else self.session.stats
        if stats is None:
            return {}
        return {
            "bytes_swapped_out": stats.bytes_swapped_out,
            "bytes_swapped_in": stats.bytes_swapped_in,
            "wait_seconds": stats.wait_seconds,
            "ledger_peak_bytes": stats.ledger_peak_bytes,
            "engine_peak_bytes": stats.peak_device_bytes,
            "engine_step_seconds": stats.step_seconds,
            "engine_forward_seconds": stats.forward_seconds,
            "engine_backward_seconds": stats.backward_seconds,
            "profiling": stats.profiling,
            "timed": stats.timed,
            "observed": stats.observed,
            "predicted_peak_bytes": stats.predicted_peak_bytes,
            "predicted_step_seconds": stats.predicted_step_seconds,
            "graph_changed": stats.graph_changed,
            "storages_swapped_out": stats.storages_swapped_out,
            "host_seconds_per_swapped_storage": stats.host_seconds_per_swapped_storage,
            "plan_id": id(self.plan),
        }

    @property
    def plan(self) -> Plan | None:
        return None if self.session is None else self.session.plan

    def teardown(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
