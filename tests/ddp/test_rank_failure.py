"""An error on one rank ends every rank with that error, promptly (no wait for the collective timeout).

Two real ranks, one of them failing: test_launched.py; the watch alone here."""

import time

import pytest
from torch.distributed import HashStore

from lightning_accudnn.session.rank_failure import FAILURE_KEY, RankFailureWatch

pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp]


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
