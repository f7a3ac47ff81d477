"""Ranks agree on re-planning at agreement points only (every N passes), not with a collective
on every backward, make the same plans from then on, and do not hang when one rank alone
meets a new batch shape (and so profiles or refines at a pass where the other does not). A
rank whose pass passed the budget re-plans at once, without waiting for the agreement."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.strategy.helpers import memory_need

pytestmark = [pytest.mark.timeout(240), pytest.mark.ddp, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("agreement_ranks.py")


def test_two_ranks_agree_a_bounded_number_of_times_and_plan_alike(tmp_path):
    static, saved = memory_need("cnn")
    steps, every, overshoot_at, other_shape_at = 12, 5, 3, 6
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(tmp_path),
            str(static + saved // 2),
            str(steps),
            str(every),
            str(overshoot_at),
            str(other_shape_at),
        ],
        cwd=SCRIPT.parents[2],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]

    # Agreements after passes 5 and 10 only: one gather of requests each, plus one of profiles
    # when something is re-planned (pass 5: the pass profiled and refined by each rank alone,
    # with rank 1's overshoot of pass 4; pass 10: rank 1's pass at a batch size of its own).
    expected = [0, 0, 0, 0, 2, 2, 2, 2, 2, 4, 4, 4]
    assert ranks[0]["collectives"] == ranks[1]["collectives"] == expected

    agreed = [step for step in range(4, steps) if step != other_shape_at]
    assert [ranks[0]["plans"][step] for step in agreed] == [ranks[1]["plans"][step] for step in agreed], (
        "the ranks ran different plans after agreeing"
    )
    # Rank 1 grows its reserve at once, after its pass over the budget (pass 4); rank 0 at the
    # next agreement point, to as much.
    assert [plan[3] for plan in ranks[1]["plans"]] == [0] * 3 + [1000] * 9
    assert [plan[3] for plan in ranks[0]["plans"]] == [0] * 4 + [1000] * 8
