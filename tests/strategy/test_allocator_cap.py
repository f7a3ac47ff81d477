"""The allocator cap is on around training steps only, the user's fraction comes back, and the
overshoot check reads allocated bytes against the ledger. CPU: the allocator is faked behind
AllocatorControl."""

import torch

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.allocator import CudaAllocatorControl
from tests.models import Classifier, loader, loss_of, make_batch, make_model
from tests.strategy.helpers import memory_need, trainer_for


class FakeAllocator:
    """A per-process memory fraction like CUDA's: the user's own to start with."""

    def __init__(self, total: int, user_fraction: float = 0.7) -> None:
        self.total = total
        self.fraction = user_fraction
        self._previous = None
        self.calls = []
        self.reported_peaks = None

    @property
    def capped(self) -> bool:
        return self._previous is not None

    def cap(self, budget_bytes):
        if self._previous is None:
            self._previous = self.fraction
            self.fraction = budget_bytes / self.total
            self.calls.append("cap")

    def lift(self):
        if self._previous is not None:
            self.fraction, self._previous = self._previous, None
            self.calls.append("lift")

    def peaks(self):
        return self.reported_peaks

    def allocated_peak_reader(self):
        return None


class RecordsTheCap(Classifier):
    """Notes whether the cap is on in each training and validation step; validates on larger batches."""

    def __init__(self, allocator: FakeAllocator) -> None:
        super().__init__("cnn")
        self.allocator = allocator
        self.capped_in = []

    def training_step(self, batch, batch_idx):
        self.capped_in.append(("train", self.allocator.capped))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        assert batch[0].shape[0] == 32
        self.capped_in.append(("validate", self.allocator.capped))
        super().validation_step(batch, batch_idx)


def test_cap_is_on_in_training_steps_only_and_the_users_fraction_is_restored():
    static, saved = memory_need("cnn")
    allocator = FakeAllocator(total=100 * (static + saved))
    strategy = AccUDNNStrategy(budget=static + saved // 2, min_swap_bytes=0)
    strategy.offload_allocator = allocator
    model = RecordsTheCap(allocator)
    trainer = trainer_for(strategy, max_steps=4, val_check_interval=2, limit_val_batches=1)
    trainer.fit(model, loader("cnn", batches=4), loader("cnn", batches=1, batch_size=32))

    assert model.capped_in == [
        ("validate", False),  # the sanity check, before any training step
        ("train", True),
        ("train", True),
        ("validate", False),  # a larger evaluation batch is not held to the training budget
        ("train", True),
        ("train", True),
        ("validate", False),
    ]
    assert allocator.fraction == 0.7  # the user's own, not 1.0
    trainer.validate(model, loader("cnn", batches=1, batch_size=32))
    assert allocator.fraction == 0.7 and not allocator.capped


def test_cuda_control_restores_the_previous_fraction_not_one(monkeypatch):
    fractions = {"now": 0.6}
    properties = type("Properties", (), {"total_memory": 1000})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: fractions["now"])
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda fraction, device: fractions.update(now=fraction)
    )
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    control = CudaAllocatorControl(torch.device("cuda", 0))
    control.cap(250)
    assert fractions["now"] == 0.25
    control.cap(250)  # idempotent: the fraction to restore is still the user's
    control.lift()
    assert fractions["now"] == 0.6
    control.lift()
    assert fractions["now"] == 0.6


def test_cuda_control_keeps_the_peaks_its_readings_reset_for_the_pass(monkeypatch):
    """Each reading of the allocated peak resets the allocator's peaks; the pass's peaks (allocated
    and reserved) are still the most since the last ``peaks()``, and the cap starts them afresh."""
    allocator = {"allocated": 0, "reserved": 0, "allocated_peak": 0, "reserved_peak": 0}

    def stats(device):
        return {
            "allocated_bytes": {"all": {"peak": allocator["allocated_peak"]}},
            "reserved_bytes": {"all": {"peak": allocator["reserved_peak"]}},
        }

    def reset(device):
        allocator.update(allocated_peak=allocator["allocated"], reserved_peak=allocator["reserved"])

    def use(allocated, reserved):
        allocator.update(allocated=allocated, reserved=reserved)
        allocator["allocated_peak"] = max(allocator["allocated_peak"], allocated)
        allocator["reserved_peak"] = max(allocator["reserved_peak"], reserved)

    properties = type("Properties", (), {"total_memory": 1000})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction, device: None)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    control = CudaAllocatorControl(torch.device("cuda", 0))
    use(900, 950)  # before training: not the pass's
    use(100, 950)
    control.cap(500)
    read = control.allocated_peak_reader()
    use(400, 960)
    use(300, 960)
    assert read() == 400
    use(350, 960)
    assert read() == 350
    use(200, 960)
    assert control.peaks() == (400, 960)
    use(250, 960)
    assert read() == 250 and control.peaks() == (250, 960)


class ReportsOverTheLedger(FakeAllocator):
    """Allocated: the engine's ledger peak plus what a test says the ledger did not see."""

    def __init__(self, total: int) -> None:
        super().__init__(total)
        self.session = None
        self.unseen_bytes = 0
        self.reserved_bytes = 0

    def peaks(self):
        return self.session.engine.ledger.peak_bytes + self.unseen_bytes, self.reserved_bytes


def _train_step(session, model, optimizer, step):
    """One SGD step of ``model`` on the CNN batch of seed ``step``, through ``session``."""
    with session.step(model, optimizer):
        loss = loss_of(model, make_batch("cnn", seed=step))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_overshoot_is_the_allocated_peak_past_the_usable_budget_not_the_allocators_cache():
    """Reserved bytes up to the budget raise nothing (the allocator frees its cache under the
    cap before it fails, and its cache from earlier passes does not shrink with the plan), nor
    does an allocated peak within the usable budget (the budget less the reserve); past it, the
    reserve grows by as much."""
    model = make_model("cnn")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    static, saved = memory_need("cnn")
    budget = static + saved
    allocator = ReportsOverTheLedger(total=10 * budget)
    session = OffloadSession(
        OffloadConfig(budget=budget, min_swap_bytes=0, reserve_bytes=1000, observe_every=1),
        "cpu",
        allocator=allocator,
    )
    allocator.session = session
    allocator.reserved_bytes = budget
    reserves, room = [], []
    for step, over in enumerate([5000, 0, 700]):  # the profiling pass is not checked
        usable = session.headroom.usable_bytes
        allocator.unseen_bytes = 0
        if step:  # the allocated peak ``over`` bytes past the usable budget
            allocator.unseen_bytes = usable + over - session.plan.predicted_peak_bytes
        _train_step(session, model, optimizer, step)
        assert session.stats.ledger_peak_bytes <= budget - 1000
        room.append(session.stats.peak_device_bytes - usable)
        reserves.append(session.reserve_bytes)
    assert room[1:] == [0, 700]
    assert reserves == [1000, 1000, 1700]
    assert session.stats.peak_reserved_bytes == budget
    session.close()


def test_the_predicted_peak_counts_what_the_allocator_held_above_the_ledger_before():
    """Memory no layer saves (a loss's working memory, workspaces) is in the next predictions:
    a predicted peak is the plan's plus the most any earlier pass held above the ledger."""
    model = make_model("cnn")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    static, saved = memory_need("cnn")
    budget = 10 * (static + saved)
    allocator = ReportsOverTheLedger(total=10 * budget)
    session = OffloadSession(
        OffloadConfig(budget=budget, min_swap_bytes=0, observe_every=1), "cpu", allocator=allocator
    )
    allocator.session = session
    predicted, unseen_before = [], 0
    for step, unseen in enumerate([3000, 1000, 5000, 0]):
        allocator.unseen_bytes = unseen
        _train_step(session, model, optimizer, step)
        stats = session.stats
        if step:
            assert stats.predicted_peak_bytes == session.plan.predicted_peak_bytes + unseen_before
            predicted.append(stats.predicted_peak_bytes - session.plan.predicted_peak_bytes)
        unseen_before = max(unseen_before, unseen)
    assert predicted == [3000, 3000, 5000]
    session.close()
