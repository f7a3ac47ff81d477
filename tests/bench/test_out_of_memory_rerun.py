"""An accudnn row re-plans and reruns a step that ran out of device memory, as the strategy
does, freeing what the failed pass left once its error is gone (while the error lives, its
traceback's frames keep the failed pass's tensors)."""

import sys

import torch

from bench.config import RunConfig, StrategySpec
from bench.runner import HOST_PROFILED_STEPS, run_strategy
from bench.techniques import AccUDNN
from bench.workloads import tiny
from lightning_accudnn.session import OffloadSession
from tests.strategy.test_out_of_memory import FaultyDevice


def test_an_out_of_memory_step_is_rerun_after_the_failed_pass_is_freed(monkeypatch):
    workload = tiny()
    config = RunConfig(torch.device("cpu"), warmup=1, steps=2, min_swap_bytes=0)
    oracle = run_strategy(workload, StrategySpec("oracle", "oracle"), config).row
    budget = oracle.static_bytes + (oracle.ledger_peak_bytes - oracle.static_bytes) // 2
    device = FaultyDevice("allocate")  # fails the backward's first prefetch once armed
    steps, errors_alive = [], []

    def prepare(self, model, optimizer, on):
        self.session = OffloadSession(self.config, on, runtime=device)
        return model

    original_context, original_release = AccUDNN.forward_context, AccUDNN.release_failed_pass

    def forward_context(self, model, optimizer, batch):
        steps.append(len(steps))
        device.armed = len(steps) == 3  # a planned pass that swaps
        return original_context(self, model, optimizer, batch)

    def release_failed_pass(self):
        errors_alive.append(sys.exc_info()[1])
        original_release(self)

    monkeypatch.setattr(AccUDNN, "prepare", prepare)
    monkeypatch.setattr(AccUDNN, "forward_context", forward_context)
    monkeypatch.setattr(AccUDNN, "release_failed_pass", release_failed_pass)
    row = run_strategy(workload, StrategySpec("accudnn", "accudnn", {"budget_bytes": budget}), config).row

    assert device.fired == 1
    assert row.status == "ok", row.error
    # The warm-up's one step (the profiling pass) is not settled: it runs 2, the most it may.
    assert row.warmup_steps == 2 and row.steps_completed == 4  # one step ran twice, then the host's
    assert len(steps) == 5 + HOST_PROFILED_STEPS
    assert row.notes == [
        "step 2: OutOfMemoryError, re-planned and run again",
        "warm-up ran 2 steps (1 asked): the technique had not settled",
    ]
    assert errors_alive == [None], "the failed pass was released while its error (and frames) lived"
