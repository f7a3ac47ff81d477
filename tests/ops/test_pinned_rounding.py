"""The host cap counts the bytes really pinned: PyTorch's caching host allocator rounds every
pinned request up to a power of two, so a pinned pool counts (and asks for) the rounded size.
Real pinning needs CUDA; on CPU the pool's pinned accounting is switched on by itself."""

import pytest
import torch

from lightning_accudnn.ops import HostBufferPool, HostMemoryExceeded, OffloadEngine, SwapSchedule
from tests.models import SmallResNet, loss_of, make_batch


def test_a_pinned_pool_counts_power_of_two_buffers_and_its_cap_bounds_them():
    pool = HostBufferPool(pin_memory=False, capacity_bytes=2 * 2**20, pinned_rounding=True)
    first = pool.acquire(600_000)
    assert first.numel() == 2**20 and pool.in_use_bytes == pool.allocated_bytes == 2**20
    pool.acquire(600_000)
    assert not pool.can_hold(600_000)
    with pytest.raises(HostMemoryExceeded, match=r"600000 more bytes \(1048576 pinned\)"):
        pool.acquire(600_000)  # 1.8 MB asked, 3 MiB would be pinned
    pool.release(first)
    assert pool.acquire(700_000) is first  # the same power-of-two bucket

    unpinned = HostBufferPool(pin_memory=False, capacity_bytes=2 * 2**20)
    for _ in range(3):
        unpinned.acquire(600_000)  # 512-byte alignment only: three fit
    assert unpinned.in_use_bytes == 3 * 600_064


def test_an_engine_with_a_pinned_pool_stays_within_the_cap_in_rounded_bytes():
    torch.manual_seed(0)
    model = SmallResNet()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    engine.pool = HostBufferPool(pin_memory=False, capacity_bytes=2**40, pinned_rounding=True)
    schedule = SwapSchedule.swap_everything(max_copying_out_bytes=0)
    with engine.offload(model, schedule):
        loss = loss_of(model, make_batch("cnn"))
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    pinned = engine.pool.allocated_bytes
    assert pinned > stats.bytes_swapped_out  # the rounding is counted, not just the bytes asked

    # A cap between the bytes swapped and the bytes pinned: enough for unpinned buffers, and
    # the pinned accounting refuses it.
    cap = (stats.bytes_swapped_out + pinned) // 2
    engine.pool = HostBufferPool(pin_memory=False, capacity_bytes=cap)
    with engine.offload(model, schedule):
        loss = loss_of(model, make_batch("cnn"))
    loss.backward()
    assert engine.end_step() is not None
    engine.pool = HostBufferPool(pin_memory=False, capacity_bytes=cap, pinned_rounding=True)
    with pytest.raises(HostMemoryExceeded), engine.offload(model, schedule):
        loss_of(model, make_batch("cnn"))
    engine.close()
