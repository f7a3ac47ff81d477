"""Profiling within a host-memory cap smaller than all the activations.

The profiling pass swaps everything it can; what does not fit in the host pool stays on
the device and is still measured, so the plan is made from the whole step and checked
against the cap, and an error says which limit to change and by how much.
"""

import pytest
import torch

from lightning_accudnn.ops import HostMemoryExceeded, OffloadEngine, SwapSchedule
from lightning_accudnn.session import OffloadConfig, OffloadSession
from tests.models import SmallResNet, loss_of, make_batch
from tests.session_training import measured_cnn_pass, train_cnn


def activation_bytes() -> int:
    return sum(layer.saved_bytes for layer in measured_cnn_pass(SmallResNet()).layers)


def test_profiling_schedule_keeps_what_passes_the_cap_and_measures_all_of_it():
    torch.manual_seed(0)
    model = SmallResNet()
    saved = activation_bytes()
    cap = int(0.8 * saved)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, host_memory_limit=cap)
    schedule = SwapSchedule.swap_everything(max_copying_out_bytes=0, keep_beyond_host_limit=True)
    with engine.offload(model, schedule):
        loss = loss_of(model, make_batch("cnn"))
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    assert 0 < stats.bytes_swapped_out <= cap < saved
    assert sum(layer.swappable_bytes for layer in stats.layers) == saved
    assert engine.pool.allocated_bytes <= cap

    with (
        pytest.raises(HostMemoryExceeded, match="host_memory_limit"),
        engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)),
    ):
        loss_of(model, make_batch("cnn"))


def test_session_under_a_host_cap_below_the_activations_trains_when_nothing_needs_swapping():
    saved = activation_bytes()
    config = OffloadConfig(budget="1GB", min_swap_bytes=0, host_memory_limit=int(0.8 * saved))
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(config, "cpu") as session:
        train_cnn(session, SmallResNet(), steps=3)
        assert session.plan is not None and session.plan.swapped_bytes == 0
        assert session.stats is not None and session.stats.bytes_swapped_out == 0


def test_a_cap_truly_too_small_names_the_limit_and_the_amount():
    saved = activation_bytes()
    probe = OffloadConfig(budget="1GB", min_swap_bytes=0)
    with pytest.warns(UserWarning, match="CPU"), OffloadSession(probe, "cpu") as session:
        train_cnn(session, SmallResNet(), steps=1)
        assert session.plan is not None
        static = session.plan.profile.static_bytes
    config = OffloadConfig(budget=static + saved // 3, min_swap_bytes=0, host_memory_limit=saved // 4)
    with (
        pytest.warns(UserWarning, match="CPU"),
        OffloadSession(config, "cpu") as session,
        pytest.raises(HostMemoryExceeded, match=r"Raise host_memory_limit by at least .* every activation"),
    ):
        train_cnn(session, SmallResNet(), steps=2)
