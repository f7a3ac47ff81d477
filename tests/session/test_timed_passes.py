"""``stats.timed`` says which passes ran timed layer by layer: the profiling pass, those refining
its plan, and the first under a plan recomputing other segments; logged as ``accudnn/timed``."""

from __future__ import annotations

from lightning_accudnn import OffloadConfig
from lightning_accudnn.planner import min_budget_bytes
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from tests.recompute.training import STEPS, measured_profile, train


def test_the_profiling_and_refining_passes_are_timed_and_the_steady_ones_not():
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="recompute")
    budget = min_budget_bytes(measured_profile("resnet", config), policy="recompute")
    record = []
    train("resnet", config.replace(budget=budget), after_step=lambda session: record.append(session.stats))
    timed = [stats.timed for stats in record]
    assert len(timed) == STEPS
    assert timed[: 1 + TIMED_PLANNED_PASSES] == [True] * (1 + TIMED_PLANNED_PASSES)
    assert timed[-2:] == [False, False]
    assert [stats.as_metrics()["accudnn/timed"] for stats in record] == [float(flag) for flag in timed]
