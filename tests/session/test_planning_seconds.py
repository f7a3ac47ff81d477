"""``OffloadStats.planning_seconds``: the host time a pass spent planning the passes after it,
reported by the passes that planned (the profiling pass, the timed passes that refine its plan)
and zero on the steady passes that planned nothing; logged as ``accudnn/planning_seconds``."""

import copy

import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.models import SmallResNet
from tests.session.helpers import memory_need, sgd
from tests.session_training import train_cnn

STEPS = 8


def test_only_the_passes_that_plan_report_planning_time():
    torch.manual_seed(0)
    model = SmallResNet()
    static, saved = memory_need(copy.deepcopy(model), sgd(copy.deepcopy(model)), "cnn")
    config = OffloadConfig(budget=static + int(0.5 * saved), min_swap_bytes=0, policy="swap")
    session = OffloadSession(config, torch.device("cpu"))
    stats = train_cnn(session, model, STEPS, settle=True)  # passes timed whatever the machine's speed
    session.close()

    sources = [s.plan_source.value for s in stats]
    planned = [s.planning_seconds > 0 for s in stats]
    assert planned[0] and sources[0] == "profiling"  # the profiling pass planned the next
    assert planned.count(False) >= STEPS - 4, (sources, planned)  # steady passes plan nothing
    for s in stats:
        assert s.planning_seconds >= 0
        assert s.as_metrics()["accudnn/planning_seconds"] == s.planning_seconds
    assert not planned[-1]
