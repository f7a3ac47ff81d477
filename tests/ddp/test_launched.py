"""AccUDNNDDPStrategy with gloo on 2 CPU processes, three scenarios in one launch of
tests/ddp/launched_ranks.py (Lightning's default launcher, popen): the full Lightning lifecycle,
weights equal to plain DDP bit for bit, and an error on one rank ending both promptly.

An error on one rank under the spawn launcher: test_ddp_rank_error.py."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# Spawned process groups must never hang CI: every test here is bounded (the launch included).
pytestmark = [pytest.mark.timeout(300), pytest.mark.ddp]

SCRIPT = Path(__file__).with_name("launched_ranks.py")
CONFIGURATIONS = ("defaults", "static-graph-bucket-view", "accumulation-no-sync", "find-unused-parameters")


@dataclass(frozen=True)
class Launch:
    result: subprocess.CompletedProcess
    ended_at: float  # time.time() when the launch had ended
    root: Path  # where the lifecycle wrote its checkpoints

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
    root = tmp_path_factory.mktemp("lifecycle")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(root)],
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
    assert any("step=5" in path.name for path in launch.root.rglob("*.ckpt"))


def test_weights_after_several_steps_equal_plain_ddp_bitwise_in_every_configuration(launch: Launch) -> None:
    """Plain DDP and AccUDNN DDP (swapping forced) trained in the same two ranks, per configuration."""
    bitwise = launch.section("bitwise")
    reported = dict(line.split(": ", 1) for line in bitwise.splitlines() if ": " in line)
    verdicts = {name: reported.get(name) for name in CONFIGURATIONS}
    assert verdicts == dict.fromkeys(CONFIGURATIONS, "equal"), launch.output[-3000:]


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
