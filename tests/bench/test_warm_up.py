"""The warm-up runs on while the technique has not settled (a plan still being refined), up to
twice the steps asked; the measured steps are those that follow it."""

import pytest
import torch

from bench.config import RunConfig, StrategySpec
from bench.runner import run_strategy
from bench.techniques import Technique
from bench.workloads import tiny


@pytest.mark.parametrize(("unsettled", "warmup"), [(0, 2), (1, 3), (5, 4)])
def test_the_warm_up_waits_for_the_technique_to_settle(monkeypatch, unsettled, warmup):
    answers = []

    def settled(self):
        answers.append(len(answers) >= unsettled)
        return answers[-1]

    monkeypatch.setattr(Technique, "settled", settled)
    config = RunConfig(torch.device("cpu"), warmup=2, steps=3)
    row = run_strategy(tiny(), StrategySpec("oracle", "oracle"), config).row
    assert row.status == "ok", row.error
    assert row.warmup_steps == warmup and row.measured_steps == 3 and row.steps_completed == warmup + 3
    assert len(answers) == warmup - 1  # asked after each warm-up step from the second on
    extended = [note for note in row.notes if note.startswith("warm-up ran")]
    assert extended == (
        [] if warmup == 2 else [f"warm-up ran {warmup} steps (2 asked): the technique had not settled"]
    )


def test_an_accudnn_row_measures_no_timed_pass():
    """With the headline's warm-up (six steps, up to twelve), a session settles before the
    measured steps: its profiling pass, its timed passes and the steady passes it times whole
    (and a plan made again from them) run in the warm-up; tiny's settles at its ninth or tenth
    step. (Two steps, up to four, end the warm-up before the steady passes are timed: a plan
    made again from them may then replace the one measured.)"""
    config = RunConfig(torch.device("cpu"), warmup=6, steps=3, min_swap_bytes=0)
    workload = tiny()
    oracle = run_strategy(workload, StrategySpec("oracle", "oracle"), config).row
    budget = oracle.static_bytes + (oracle.ledger_peak_bytes - oracle.static_bytes) // 2
    row = run_strategy(workload, StrategySpec("accudnn", "accudnn", {"budget_bytes": budget}), config).row
    assert row.status == "ok", row.error
    assert row.warmup_steps > 6 and row.profiling_steps_measured == 0 and row.replans_during_measurement == 0
