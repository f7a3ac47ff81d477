"""Nothing lost: failures leave no hooks and no held buffers; buffers are reused; the ledger adds up."""

import gc
import weakref

import pytest
import torch

from lightning_accudnn.ops import (
    HostMemoryExceeded,
    OffloadEngine,
    StaleSavedTensorError,
    SwapSchedule,
)
from tests.models import SmallResNet, loss_of, make_batch


def _module_hooks(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _step(engine, model, schedule, batch):
    with engine.offload(model, schedule):
        loss = loss_of(model, batch)
    loss.backward()
    return engine.end_step()


def test_exception_in_forward_removes_hooks_and_returns_buffers():
    model = SmallResNet()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    batch = make_batch("cnn")
    with pytest.raises(ZeroDivisionError) as raised, engine.offload(model, SwapSchedule.swap_everything()):
        loss = loss_of(model, batch)  # noqa: F841 -- kept alive by the traceback
        raise ZeroDivisionError("boom")
    # The traceback still references the graph, yet every host buffer is back in the pool.
    assert raised.value.__traceback__ is not None
    assert engine.pool.in_use_bytes == 0
    assert engine.pool.allocated_bytes > 0
    assert _module_hooks(model) == 0
    assert not engine.step_open
    assert engine.ledger.activation_bytes == 0

    # The stale graph refuses to run backward instead of reading recycled buffers.
    stale_loss = raised.value.__traceback__.tb_frame.f_locals["loss"]
    with pytest.raises(StaleSavedTensorError):
        stale_loss.backward()

    # No saved-tensor hooks are left: a plain step saves nothing through the engine.
    loss_of(model, batch).backward()
    assert engine.end_step() is None

    # And the engine works again.
    assert _step(engine, model, SwapSchedule.swap_everything(), batch).bytes_swapped_out > 0


def test_pool_buffers_are_reused_across_steps():
    model = SmallResNet()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    batch = make_batch("cnn")
    _step(engine, model, SwapSchedule.swap_everything(), batch)
    allocations = engine.pool.allocations
    for _ in range(3):
        _step(engine, model, SwapSchedule.swap_everything(), batch)
    assert engine.pool.allocations == allocations
    assert engine.pool.in_use_bytes == 0


def test_host_cap_raises_clear_error_and_aborts_the_step():
    model = SmallResNet()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, host_memory_limit=100_000)
    with (
        pytest.raises(HostMemoryExceeded, match="host_memory_limit"),
        engine.offload(model, SwapSchedule.swap_everything()),
    ):
        loss_of(model, make_batch("cnn"))
    assert engine.pool.in_use_bytes == 0
    assert _module_hooks(model) == 0


def test_ledger_counts_static_and_saved_bytes():
    model = SmallResNet()
    batch = make_batch("cnn")
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.keep_everything(), static_bytes=1000):
        loss = loss_of(model, batch)
    loss.backward()
    kept = engine.end_step()
    saved = sum(layer.saved_bytes for layer in kept.layers)
    assert kept.ledger_peak_bytes == 1000 + saved
    assert kept.bytes_swapped_out == 0

    swapped = _step(engine, model, SwapSchedule.swap_everything(0, max_copying_out_bytes=0), batch)
    largest = max(layer.saved_bytes for layer in swapped.layers)
    assert swapped.ledger_peak_bytes < saved / 2
    assert swapped.ledger_peak_bytes <= 2 * largest + 1000
    assert engine.ledger.activation_bytes == 0


def test_prefetch_window_bounds_what_is_brought_back_ahead():
    model = SmallResNet(blocks=6)
    batch = make_batch("cnn")
    peaks = []
    for window in (0, 2**20, 2**40):
        engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
        peaks.append(_step(engine, model, SwapSchedule.swap_everything(window, 0), batch).ledger_peak_bytes)
    assert peaks[0] < peaks[1] < peaks[2]
    # A wide window brings everything back as soon as the forward ends.
    assert peaks[2] == sum(
        layer.saved_bytes for layer in _step(engine, model, SwapSchedule.keep_everything(), batch).layers
    )


class CountingOnDemand(OffloadEngine):
    """An engine that counts the records backward had to bring back itself (not prefetched)."""

    on_demand = 0

    def _fetch(self, record):
        self.on_demand += 1
        super()._fetch(record)


@pytest.mark.parametrize("windows", [1, 3])
def test_prefetch_resumes_as_the_window_frees(windows):
    # A window of one or three of the largest storages: each time a block brought back leaves
    # it, the next records come back before backward reads them, never on demand.
    model = SmallResNet(blocks=6)
    batch = make_batch("cnn")
    engine = CountingOnDemand(torch.device("cpu"), min_swap_bytes=0)
    largest = max(
        layer.saved_bytes for layer in _step(engine, model, SwapSchedule.keep_everything(), batch).layers
    )
    stats = _step(
        engine, model, SwapSchedule.swap_everything(windows * largest, max_copying_out_bytes=0), batch
    )
    assert stats.bytes_swapped_in > 0 and engine.on_demand == 0


def test_copies_out_in_flight_are_bounded_by_the_schedule():
    model = SmallResNet(blocks=6)
    batch = make_batch("cnn")
    peaks = {}
    for limit in (None, 0):
        engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
        schedule = SwapSchedule.swap_everything(0, max_copying_out_bytes=limit)
        peaks[limit] = _step(engine, model, schedule, batch).ledger_peak_bytes
    # Unbounded, nothing leaves the device until backward; bounded, one copy at a time.
    everything = sum(
        u.saved_bytes for u in _step(engine, model, SwapSchedule.keep_everything(), batch).layers
    )
    assert peaks[None] == everything
    assert peaks[0] < everything / 3


def test_a_graph_dropped_without_backward_gives_its_host_buffers_back_when_freed():
    model = SmallResNet()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    batch = make_batch("cnn")
    with engine.offload(model, SwapSchedule.swap_everything()):
        loss = loss_of(model, batch)
    stats = engine.end_step()  # no backward: the graph is still alive
    assert stats is not None and stats.bytes_swapped_out > 0
    assert engine.ledger.activation_bytes == 0  # the device bytes left the count with the step
    assert engine.pool.in_use_bytes > 0  # the host copies stay while the graph may still read them
    del loss
    assert engine.pool.in_use_bytes == 0


def test_a_graph_retained_past_the_end_of_its_step_reads_its_swapped_copies_again():
    torch.manual_seed(0)
    model = SmallResNet()
    batch = make_batch("cnn")
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = loss_of(model, batch)
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    assert engine.end_step() is not None
    # The next step (other data) takes buffers from the pool: none of the retained graph's.
    _step(engine, model, SwapSchedule.swap_everything(max_copying_out_bytes=0), make_batch("cnn", seed=1))
    model.zero_grad()
    loss.backward()
    for a, p in zip(first, model.parameters(), strict=True):
        assert torch.equal(a, p.grad)
    del loss
    assert engine.pool.in_use_bytes == 0


@pytest.mark.parametrize("replayed", [False, True], ids=["observed", "replayed"])
def test_a_graph_dropped_without_backward_is_freed_whole_with_kept_saves_of_op_outputs(replayed):
    # ReLU saves its own output. Were its handle to hold that tensor, whose grad_fn is the ReLU's
    # node, the node would hold itself through autograd's C++ graph, out of the garbage
    # collector's sight: the graph, its kept activations and its step's host copies would never
    # be freed after a step that ends without a backward (an error, a skipped batch).
    torch.manual_seed(0)
    model = SmallResNet()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    batch = make_batch("cnn")
    profiled = _step(engine, model, SwapSchedule.keep_everything(), batch)
    names = [layer.name for layer in profiled.layers]
    schedule = SwapSchedule.swap_layers_named(names[: len(names) // 2])
    outputs = []
    handles = [
        module.register_forward_hook(lambda module, args, output: outputs.append(weakref.ref(output)))
        for module in model.modules()
        if isinstance(module, torch.nn.ReLU)
    ]
    with engine.offload(model, schedule, sequence=profiled.sequence if replayed else None):
        loss = loss_of(model, batch)
    stats = engine.end_step()
    for handle in handles:
        handle.remove()
    assert stats is not None and stats.bytes_swapped_out > 0 and outputs
    del loss
    gc.collect()
    assert all(output() is None for output in outputs)
    assert engine.pool.in_use_bytes == 0
