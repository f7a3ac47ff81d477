"""Ranks agree on re-planning at agreement points only (profiling and refining passes, then
every N passes), not with a collective on every backward, and make the same plans."""

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
    steps, every, overshoot_at = 12, 5, 3
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(tmp_path),
            str(static + saved // 2),
            str(steps),
            str(every),
            str(overshoot_at),
        ],
        cwd=SCRIPT.parents[2],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]

    # Agreements after pass 1 (profiling), 2 (refining), 7 and 12 (every 5 passes): one
    # gather of requests each, plus one of profiles when something is re-planned (passes
    # 1, 2 and 7, where rank 1's overshoot of pass 4 is agreed). Not one per pass.
    expected = [2, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 7]
    assert ranks[0]["collectives"] == ranks[1]["collectives"] == expected

    assert ranks[0]["plans"] == ranks[1]["plans"], "the ranks ran different plans"
    reserves = [plan[3] for plan in ranks[0]["plans"]]
    # Rank 1's overshoot waits for the next agreement point, then both ranks grow the reserve.
    assert reserves == [0] * 6 + [1000] * 6
