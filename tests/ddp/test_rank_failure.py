"""An error on one rank ends every rank with that error, promptly (no wait for the collective timeout)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed import HashStore

from lightning_accudnn.session.rank_failure import FAILURE_KEY, RankFailureWatch

pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]

SCRIPT = Path(__file__).with_name("one_rank_short_of_host_memory.py")


def test_host_memory_error_on_rank_one_ends_both_ranks_within_a_minute():
    """Lightning's default launcher (popen): rank 0 is this process's child script's main
    process, rank 1 its child; without the watch rank 0 would wait in the all-reduce for
    the process group's 30-minute timeout."""
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(SCRIPT)],
        cwd=SCRIPT.parents[2],
        capture_output=True,
        text=True,
        timeout=180,
    )
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "fit returned" not in output
    assert "HostMemoryExceeded" in output  # rank 1's own traceback
    assert "rank 1 raised HostMemoryExceeded" in output and "ending rank 0 too" in output, output[-3000:]
    assert elapsed < 60, f"took {elapsed:.0f} s"


def test_the_first_report_wins_and_a_rank_that_failed_itself_is_not_ended_by_the_watch():
    store = HashStore()
    ended = []
    watches = [
        RankFailureWatch(rank=rank, store=store, poll_seconds=0.01, grace_seconds=0, end=ended.append)
        for rank in range(3)
    ]
    watches[1].report(RuntimeError("budget too small on this device"))
    watches[0].report(RuntimeError("a consequence"))  # rank 0 ends with its own error
    for watch in watches:
        watch.start()
    for watch in watches:
        watch.join(timeout=5)
    assert store.get(FAILURE_KEY).decode() == "rank 1 raised RuntimeError: budget too small on this device"
    assert ended == [
        "lightning-accudnn: rank 1 raised RuntimeError: budget too small on this device; ending rank 2 too"
    ]


def test_a_stopped_watch_ends_nothing():
    store = HashStore()
    ended = []
    watch = RankFailureWatch(rank=0, store=store, poll_seconds=0.01, grace_seconds=0.5, end=ended.append)
    watch.start()
    watch.stop()
    RankFailureWatch(rank=1, store=store).report(RuntimeError("late"))
    time.sleep(0.1)
    assert ended == []
