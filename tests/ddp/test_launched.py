"""Two gloo ranks on the CPU, four scenarios in one launch of tests/ddp/launched_ranks.py
(Lightning's default launcher, popen): AccUDNNDDPStrategy through the full Lightning lifecycle,
with weights equal to plain DDP bit for bit; OffloadSessions in a plain loop agreeing on
re-planning; and an error on one rank ending both promptly.

An error on one rank under the spawn launcher: test_ddp_rank_error.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.strategy.helpers import memory_need

# Spawned process groups must never hang CI: every test here is bounded (the launch included).
pytestmark = [pytest.mark.timeout(300), pytest.mark.ddp]

SCRIPT = Path(__file__).with_name("launched_ranks.py")
#: The agreement scenario's schedule: passes, agreement every N passes, rank 1 alone over its
#: budget at one pass and at a batch size of its own at another.
STEPS, EVERY, OVERSHOOT_AT, OTHER_SHAPE_AT = 12, 5, 3, 6
CONFIGURATIONS = (
    "defaults",
    "static-graph-bucket-view",
    "accumulation-no-sync",
    "find-unused-parameters",
    "recompute",
    "recompute-static-graph",
)


@dataclass(frozen=True)
class Launch:
    result: subprocess.CompletedProcess
    ended_at: float  # time.time() when the launch had ended
    root: Path  # the lifecycle's checkpoints under root/lifecycle, the agreement's JSON under root/agreement

    @property
    def output(self) -> str:
        return self.result.stdout + self.result.stderr

    def section(self, name: str) -> str:
        """What the scenario ``name`` printed to stdout (up to the next scenario's start)."""
        parts = re.split(r"^== (\w+) starts at [0-9.]+$", self.result.stdout, flags=re.MULTILINE)
        sections = dict(zip(parts[1::2], parts[2::2], strict=True))
        assert name in sections, self.output[-3000:]
        return sections[name]

    def started_at(self, name: str) -> float:
        match = re.search(rf"^== {name} starts at ([0-9.]+)$", self.result.stdout, flags=re.MULTILINE)
        assert match, self.output[-3000:]
        return float(match.group(1))


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    root = tmp_path_factory.mktemp("launched")
    static, saved = memory_need("cnn")
    schedule = (static + saved // 2, STEPS, EVERY, OVERSHOOT_AT, OTHER_SHAPE_AT)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(root), *map(str, schedule)],
        cwd=SCRIPT.parents[2],
        capture_output=True,
        text=True,
        timeout=280,
    )
    return Launch(result, time.time(), root)


def test_registered_name_runs_fit_validate_checkpoint_and_restore(launch: Launch) -> None:
    """``Trainer(strategy="accudnn_ddp")`` fits with validation and a checkpoint, validates, and a
    new Trainer resumes from the checkpoint (the spawned registered name ``"accudnn_ddp_spawn"``
    fits in test_ddp_rank_error.py)."""
    lifecycle = launch.section("lifecycle")
    # Both ranks trained; the step count shows in the checkpoints rank 0 wrote.
    assert "resumed from " in lifecycle and "step=3" in lifecycle, launch.output[-3000:]
    assert any("step=5" in path.name for path in (launch.root / "lifecycle").rglob("*.ckpt"))


def test_weights_after_several_steps_equal_plain_ddp_bitwise_in_every_configuration(launch: Launch) -> None:
    """Plain DDP and AccUDNN DDP (swapping forced) trained in the same two ranks, per configuration."""
    bitwise = launch.section("bitwise")
    reported = dict(line.split(": ", 1) for line in bitwise.splitlines() if ": " in line)
    verdicts = {name: reported.get(name) for name in CONFIGURATIONS}
    assert verdicts == dict.fromkeys(CONFIGURATIONS, "equal"), launch.output[-3000:]


def test_two_ranks_agree_a_bounded_number_of_times_and_plan_alike(launch: Launch) -> None:
    """Ranks agree on re-planning at agreement points only (every N passes), not with a collective
    on every backward, make the same plans from then on, and do not hang when one rank alone
    meets a new batch shape (and so profiles or refines at a pass where the other does not). A
    rank whose pass passed the budget re-plans at once, without waiting for the agreement."""
    launch.section("failure")  # the agreement ended and the next scenario started
    ranks = [json.loads((launch.root / "agreement" / f"rank{rank}.json").read_text()) for rank in range(2)]

    # Agreements after passes 5 and 10 only: one gather of requests each, plus one of profiles
    # when something is re-planned (pass 5: the pass profiled and refined by each rank alone,
    # with rank 1's overshoot of pass 4; pass 10: rank 1's pass at a batch size of its own).
    expected = [0, 0, 0, 0, 2, 2, 2, 2, 2, 4, 4, 4]
    assert ranks[0]["collectives"] == ranks[1]["collectives"] == expected

    agreed = [step for step in range(4, STEPS) if step != OTHER_SHAPE_AT]
    assert [ranks[0]["plans"][step] for step in agreed] == [ranks[1]["plans"][step] for step in agreed], (
        "the ranks ran different plans after agreeing"
    )
    # Rank 1 grows its reserve at once, after its pass over the budget (pass 4); rank 0 at the
    # next agreement point, to as much.
    assert [plan[3] for plan in ranks[1]["plans"]] == [0] * 3 + [1000] * 9
    assert [plan[3] for plan in ranks[0]["plans"]] == [0] * 4 + [1000] * 8


def test_host_memory_error_on_rank_one_ends_both_ranks_within_a_minute(launch: Launch) -> None:
    """Rank 0 is the script's main process, rank 1 its child; without the watch rank 0 would
    wait in the all-reduce for the process group's 30-minute timeout."""
    elapsed = launch.ended_at - launch.started_at("failure")
    output = launch.output
    assert launch.result.returncode != 0, output[-3000:]
    assert "fit returned" not in output
    assert "HostMemoryExceeded" in output  # rank 1's own traceback
    assert "rank 1 raised HostMemoryExceeded" in output and "ending rank 0 too" in output, output[-3000:]
    assert elapsed < 60, f"took {elapsed:.0f} s"
