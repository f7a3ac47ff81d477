"""``OffloadController``: the previous name and call shape of :class:`~lightning_accudnn.OffloadSession`.

Kept only for ``bench/strategies.py`` (owned separately) until it drives the session
directly; new code uses the session. To be removed once nothing imports it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.session import OffloadConfig, OffloadSession, OffloadStats

__all__ = ["OffloadController"]


class OffloadController:
    """``setup(device)`` makes the session; the rest forwards to it.

    Example:
        >>> controller = OffloadController(budget="2GB", min_swap_bytes=0)
        >>> controller.plan is None
        True
    """

    def __init__(self, budget: int | str = "auto", **options: Any) -> None:
        self.config = OffloadConfig(budget=budget, **options)
        self.session: OffloadSession | None = None

    @property
    def plan(self) -> Plan | None:
        return None if self.session is None else self.session.plan

    @property
    def stats(self) -> OffloadStats | None:
        return None if self.session is None else self.session.stats

    def setup(self, device: torch.device) -> None:
        self.teardown()
        self.session = OffloadSession(self.config, device)

    @contextmanager
    def forward(
        self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], batch: Any
    ) -> Iterator[None]:
        with self._session().step(model, optimizers, batch=batch, close_on_backward=False):
            yield

    def begin_backward(self) -> None:
        self._session().begin_backward()

    def end_step(self) -> OffloadStats | None:
        return self._session().end_backward()

    def abort(self) -> None:
        if self.session is not None:
            self.session.abort()

    def teardown(self) -> None:
        if self.session is not None:
            self.session.close()

    def _session(self) -> OffloadSession:
        if self.session is None:
            raise RuntimeError("the offload controller is not set up: call setup(device) first")
        return self.session
