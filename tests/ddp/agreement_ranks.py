"""Run by tests/ddp/launched_ranks.py (for tests/ddp/test_launched.py) in its two gloo ranks:
the ranks train a plain loop under OffloadSessions with a DistributedCoordinator, rank 1 alone
reporting a peak over its budget at one pass and, at another, training a batch of another size
(a shape rank 0 never sees); each rank writes its plans and its number of collectives as JSON."""

import json
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_accudnn.session import DistributedCoordinator, OffloadConfig, OffloadSession
from tests.models import SmallResNet, loss_of, make_batch

OVERSHOOT_BYTES = 1000


class Allocator:
    """No allocator to cap (CPU); reports, when a test asks, an allocated peak ``over`` bytes
    above the usable budget (memory the plan did not count), else the ledger itself."""

    def __init__(self) -> None:
        self.session: OffloadSession | None = None
        self.over: int | None = None

    def cap(self, budget_bytes: int) -> None:
        pass

    def lift(self) -> None:
        pass

    def peaks(self):
        if self.over is None or self.session is None:
            return None
        allocated = self.session.headroom.usable_bytes + self.over
        return allocated, allocated

    def allocated_peak_reader(self):
        return None


def describe(session: OffloadSession) -> list:
    plan = session.plan
    assert plan is not None
    return [
        sorted(plan.swapped_layers),
        plan.prefetch_window_bytes,
        plan.max_copying_out_bytes,
        plan.reserve_bytes,
        plan.predicted_peak_bytes,
    ]


def run(
    rank: int,
    world: int,
    directory: str,
    budget: int,
    steps: int,
    every: int,
    overshoot_at: int,
    other_shape_at: int,
) -> None:
    torch.set_num_threads(1)  # two ranks share the cores, as torchrun's OMP_NUM_THREADS=1 has them
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world)  # the launch's group (Lightning's)
    torch.manual_seed(0)
    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    coordinator = DistributedCoordinator(every=every)
    allocator = Allocator()
    session = OffloadSession(
        OffloadConfig(budget=budget, min_swap_bytes=0), "cpu", coordinator=coordinator, allocator=allocator
    )
    allocator.session = session
    plans, collectives = [], []
    for step in range(steps):
        allocator.over = OVERSHOOT_BYTES if rank == 1 and step == overshoot_at else None
        with session.step(model, optimizer):
            batch_size = 3 if rank == 1 and step == other_shape_at else 8
            loss = loss_of(model, make_batch("cnn", batch_size, seed=100 * rank + step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        plans.append(describe(session))
        collectives.append(coordinator.collectives)
    session.close()
    Path(directory, f"rank{rank}.json").write_text(json.dumps({"plans": plans, "collectives": collectives}))
