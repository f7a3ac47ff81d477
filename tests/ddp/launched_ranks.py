"""Run by tests/ddp/test_launched.py as a script: four DDP scenarios in one launch of two gloo
ranks, each announced on stdout by rank 0 (``== NAME starts at UNIX_TIME``):

1. ``lifecycle``: tests/ddp/lifecycle_ranks.py (fit, validate, resume from a checkpoint);
2. ``bitwise``: tests/ddp/plain_and_offloaded_fits.py (plain and AccUDNN DDP, weights compared);
3. ``agreement``: tests/ddp/agreement_ranks.py (a plain loop's sessions agreeing on re-plans);
4. ``failure``: tests/ddp/one_rank_short_of_host_memory.py (rank 1's error ends both ranks), last,
   since it ends the processes.

Only the last scenario may raise in a Trainer, even an error something catches (the
EfficiencyTuner's out-of-memory trials): the strategy reports it to the process group's store,
where it stays, and the next Trainer's RankFailureWatch would end its rank at once on it. So the
EfficiencyTuner's DDP tests keep their own spawned runs (tests/callbacks/test_tuner_ddp.py).

Lightning's default launcher (popen) starts rank 1 as a child running this file again; every
later Trainer of both ranks finds the process group already there and reuses it, so the
scenarios cost one launch (two interpreters importing torch and Lightning) instead of four.

Usage: ``python tests/ddp/launched_ranks.py ROOT BUDGET STEPS EVERY OVERSHOOT_AT OTHER_SHAPE_AT``:
the lifecycle's checkpoints go under ROOT/lifecycle, the agreement's JSON under ROOT/agreement
(its budget and schedule as agreement_ranks.py takes them)."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tests.ddp import (  # noqa: E402
    agreement_ranks,
    lifecycle_ranks,
    one_rank_short_of_host_memory,
    plain_and_offloaded_fits,
)


def announce(name: str) -> None:
    # Lightning sets LOCAL_RANK for the child it starts; before the first Trainer only rank 0 runs.
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"== {name} starts at {time.time():.3f}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)  # two ranks share the cores, as torchrun's OMP_NUM_THREADS=1 has them
    root = Path(sys.argv[1])
    budget, steps, every, overshoot_at, other_shape_at = map(int, sys.argv[2:7])
    announce("lifecycle")
    lifecycle_ranks.main(root / "lifecycle")
    announce("bitwise")
    plain_and_offloaded_fits.main()
    announce("agreement")
    (root / "agreement").mkdir(exist_ok=True)
    agreement_ranks.run(
        torch.distributed.get_rank(),
        2,
        str(root / "agreement"),
        budget,
        steps,
        every,
        overshoot_at,
        other_shape_at,
    )
    announce("failure")
    one_rank_short_of_host_memory.main()
