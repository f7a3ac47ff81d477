"""``OffloadStats.planning_seconds``: the host time a pass spent planning the passes after it,
reported by the passes that planned (the profiling pass, the timed passes that refine its plan)
and zero on the steady passes that planned nothing; logged as ``accudnn/planning_seconds``."""

import copy

import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.models import SmallResNet, loss_of, make_batch
from tests.session.helpers import memory_need, sgd

STEPS = 8


def test_only_the_passes_that_plan_report_planning_time():
    torch.manual_seed(0)
    model = SmallResNet()
    optimizer = sgd(model)
    static, saved = memory_need(copy.deepcopy(model), sgd(copy.deepcopy(model)), "cnn")
    config = OffloadConfig(budget=static + int(0.5 * saved), min_swap_bytes=0, policy="swap")
    session = OffloadSession(config, torch.device("cpu"))
    stats = []
    for index in range(STEPS):
        with session.step(model, optimizer):
            loss = loss_of(model, make_batch("cnn", 8, seed=index))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        stats.append(session.stats)
    session.close()

    sources = [s.plan_source.value for s in stats]
    planned = [s.planning_seconds > 0 for s in stats]
    assert planned[0] and sources[0] == "profiling"  # the profiling pass planned the next
    assert planned.count(False) >= STEPS - 4, (sources, planned)  # steady passes plan nothing
    for s, did_plan in zip(stats, planned, strict=True):
        assert s.planning_seconds >= 0
        if not did_plan:
            assert s.planning_seconds == 0.0
        assert s.as_metrics()["accudnn/planning_seconds"] == s.planning_seconds
    assert not planned[-1]
