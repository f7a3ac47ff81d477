"""The session plans within the host limit in the bytes the pool really holds (pinned buffers
rounded up to powers of two), and measures the host link before capping the allocator, at the
sizes of the storages it swaps."""

import pytest
import torch

from lightning_accudnn.ops import HostBufferPool, HostMemoryExceeded
from lightning_accudnn.planner import BudgetTooSmallError
from lightning_accudnn.profiling.bandwidth import LinkCurve
from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session import session as session_module
from lightning_accudnn.session.transfers import transfer_sizes
from tests.models import SmallResNet
from tests.session_training import measured_cnn_pass, train_cnn

pytestmark = pytest.mark.filterwarnings("ignore:lightning-accudnn on CPU")


def _pinned_session(budget: int, host_limit: int) -> OffloadSession:
    session = OffloadSession(
        OffloadConfig(budget=budget, min_swap_bytes=0, host_memory_limit=host_limit), "cpu"
    )
    session.engine.pool = HostBufferPool(pin_memory=False, capacity_bytes=host_limit, pinned_rounding=True)
    return session


def test_the_plan_fits_the_host_limit_in_pinned_bytes(monkeypatch):
    # A link too fast to wait on: every plan is equally fast, so each session plans the one
    # swapping the fewest bytes (the same plan, whatever the measured layer times).
    fast = LinkCurve((2**10, 2**26), (1e-12, 1e-9), (1e-12, 1e-9))
    monkeypatch.setattr(session_module, "probe_host_link", lambda device: fast)
    torch.manual_seed(0)
    with OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu") as probe:
        train_cnn(probe, SmallResNet(), steps=1)
        assert probe.plan is not None
        static, saved = probe.plan.profile.static_bytes, probe.plan.profile.saved_bytes
    budget = static + saved // 2
    with _pinned_session(budget, 2**30) as free:
        model = SmallResNet()
        train_cnn(free, model, steps=3)  # profile, plan, refine
        free.engine.pool = HostBufferPool(pin_memory=False, capacity_bytes=2**30, pinned_rounding=True)
        train_cnn(free, model, steps=1)  # one planned step in a fresh pool: what the plan pins
        assert free.plan is not None
        swapped, pinned = free.plan.swapped_bytes, free.engine.pool.allocated_bytes
    assert 0 < swapped < pinned  # what the plan swaps, and what the pool pins for it

    # Room for the plan's bytes but not for them pinned: planned within the limit in pinned
    # bytes (a plan pinning less), or refused when planning, never by the pool mid-step.
    host_limit = (swapped + pinned) // 2
    with _pinned_session(budget, host_limit) as session:
        try:
            train_cnn(session, SmallResNet(), steps=3)
        except HostMemoryExceeded as error:
            assert "no plan fits both the device budget" in str(error)
        else:
            assert session.engine.pool.allocated_bytes <= host_limit

    with _pinned_session(budget, pinned) as session:
        train_cnn(session, SmallResNet(), steps=3)
        assert session.plan is not None and session.plan.swapped_bytes == swapped
        assert session.engine.pool.allocated_bytes == pinned

    # Too little host memory: the profiling pass keeps on the device what the pool cannot take,
    # past the device budget. Refused at its end as a host-memory error (with host memory for
    # everything the budget would do), naming the host memory needed and the pass's measured peak.
    with (
        _pinned_session(static + saved // 3, swapped // 3) as session,
        pytest.raises(
            HostMemoryExceeded,
            match=r"host-memory limit of .* Raise host_memory_limit by at least .* or raise the budget",
        ) as raised,
    ):
        train_cnn(session, SmallResNet(), steps=2)
    assert session.stats is not None and session.stats.profiling
    cause = raised.value.__cause__
    assert isinstance(cause, BudgetTooSmallError)
    assert cause.min_budget_bytes == session.stats.ledger_peak_bytes > static + saved // 3
    assert cause.with_host_memory_for_all_bytes <= static + saved // 3


def test_the_link_is_probed_before_the_cap_and_rated_at_the_swapped_sizes(monkeypatch):
    # A link with a large cost per copy: small copies reach a fraction of the large ones' rate.
    curve = LinkCurve((2**10, 2**26), (1e-3, 1e-3 + 2**26 / 1e10), (1e-3, 1e-3 + 2**26 / 2e10))
    events = []

    def probe(device):
        events.append("probe")
        return curve

    class Allocator:
        def cap(self, budget_bytes):
            events.append("cap")

        def lift(self):
            events.append("lift")

        def peaks(self):
            return None

        def allocated_peak_reader(self):
            return None

    monkeypatch.setattr(session_module, "probe_host_link", probe)
    model = SmallResNet()
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu", allocator=Allocator())
    assert events == ["probe"]
    train_cnn(session, model, steps=1)
    assert events.index("probe") < events.index("cap")

    expected = curve.link_for(transfer_sizes(measured_cnn_pass(model).sequence, 0))
    assert session.plan is not None
    profile = session.plan.profile
    assert profile.d2h_bytes_per_second == pytest.approx(expected.d2h_bytes_per_second)
    assert profile.h2d_bytes_per_second == pytest.approx(expected.h2d_bytes_per_second)
    assert profile.d2h_bytes_per_second < 0.5 * curve.link_for().d2h_bytes_per_second
    session.close()


def test_the_host_buffers_a_plan_swaps_into_are_reserved_when_it_is_made(monkeypatch):
    fast = LinkCurve((2**10, 2**26), (1e-12, 1e-9), (1e-12, 1e-9))
    monkeypatch.setattr(session_module, "probe_host_link", lambda device: fast)
    torch.manual_seed(0)
    model = SmallResNet()
    with OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu") as probe:
        train_cnn(probe, model, steps=1)
        assert probe.plan is not None
        static, saved = probe.plan.profile.static_bytes, probe.plan.profile.saved_bytes
    with _pinned_session(static + saved // 2, 2**30) as session:
        pool = session.engine.pool
        pinned_before_the_plan = []
        reserve = pool.reserve
        monkeypatch.setattr(
            pool,
            "reserve",
            lambda sizes: (pinned_before_the_plan.append(pool.allocated_bytes), reserve(sizes))[1],
        )
        train_cnn(session, model, steps=1)  # the profiling pass swaps everything; the plan follows
        plan = session.plan
        assert plan is not None and 0 < plan.swapped_bytes < saved
        # What the profiling pass pinned beyond the plan's buffers is freed, the rest held idle...
        held, allocations = pool.allocated_bytes, pool.allocations
        assert pool.in_use_bytes == 0 and pool.idle_bytes == held
        assert plan.swapped_bytes <= held < pinned_before_the_plan[0]
        # ...and the planned passes take every buffer from them: none allocated in forward.
        train_cnn(session, model, steps=2)
        assert session.plan is plan or session.plan.swapped_layers == plan.swapped_layers
        assert pool.allocations == allocations and pool.allocated_bytes == held
