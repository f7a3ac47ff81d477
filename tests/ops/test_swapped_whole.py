"""Swaps of whole storages in replayed passes: a storage that had one record over all its
bytes in the profiled pass is swapped on a shorter path (no filter, no extent arithmetic, no
storage entry), checked at each save to be the same again. What autograd reads, the ledger and
the device's stream order stay those of the records; a save that does not match leaves the
path (the graph changed) and autograd still reads what it would without hooks."""

import copy

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule, keep_on_device
from lightning_accudnn.ops.errors import HostMemoryExceeded
from lightning_accudnn.ops.replay import SWAP_AGAIN, SWAP_WHOLE, ReplayRoute
from lightning_accudnn.testing import SimulatedGPU


class Blocks(nn.Module):
    """Linear/LayerNorm/ReLU blocks; the next Linear saves each ReLU output again. Between the
    first two blocks a fresh tensor ``h`` is saved twice, by two products with ``scale``. With
    ``sliced`` ``h`` is a slice of a larger storage (the same bytes saved); with ``bumped`` it
    is doubled in place between its two saves and the first product leaves the graph, so that
    plain autograd never reads the first save and reads the doubled ``h`` for the second."""

    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()) for _ in range(depth)
        )
        self.scale = nn.Parameter(torch.ones(width))
        self.sliced = False
        self.bumped = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](x) + 1.0
        if self.sliced:
            h = torch.cat([h, h]).narrow(0, 0, h.shape[0])
        first = h * self.scale  # saves h (and the scale)
        if self.bumped:
            first = first.detach()
            h.mul_(2.0)
        h = first + h * self.scale  # saves h again
        for block in self.blocks[1:]:
            h = block(h)
        return h.square().sum()


def _engine(lag: int | None) -> OffloadEngine:
    runtime = None if lag == -1 else SimulatedGPU(lag=lag, seed=1)
    return OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)


def _profile(engine: OffloadEngine, model: nn.Module, x: torch.Tensor):
    with engine.offload(model, SwapSchedule.keep_everything()):
        loss = model(x)
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.sequence is not None
    model.zero_grad(set_to_none=True)
    return stats


def _swap_all_but_last(stats) -> SwapSchedule:
    names = [layer.name for layer in stats.layers]
    return SwapSchedule.swap_layers_named(names[:-1], prefetch_window_bytes=256, max_copying_out_bytes=0)


def _profiled_blocks(lag: int | None):
    """A :class:`Blocks` model, its batch, an engine (``lag`` -1: host copies, else a simulated
    GPU at that lag) that profiled it, the profile and a schedule swapping all but its last layer."""
    torch.manual_seed(0)
    model = Blocks()
    x = torch.randn(8, 16)
    engine = _engine(lag)
    profiled = _profile(engine, model, x)
    return model, x, engine, profiled, _swap_all_but_last(profiled)


def _step(engine, model, x, schedule, sequence):
    with engine.offload(model, schedule, sequence=sequence):
        loss = model(x)
    loss.backward()
    return loss, engine.end_step()


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]


def _replayed_as_plain(engine, model, plain, x, schedule, sequence, steps):
    """``steps`` passes of ``model`` replayed on ``sequence`` under ``schedule``, each checked to
    swap without a graph change and to give the loss and gradients ``plain`` (a copy of
    ``model``) gives without hooks; yields each pass's stats before the gradients are cleared."""
    plain_loss = plain(x)
    plain_loss.backward()
    for _ in range(steps):
        loss, stats = _step(engine, model, x, schedule, sequence)
        assert not stats.graph_changed and stats.bytes_swapped_out > 0
        assert torch.equal(loss, plain_loss)
        assert all(torch.equal(a, b) for a, b in zip(_grads(model), _grads(plain), strict=True))
        yield stats
        model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("lag", [-1, 0, 3, None])
def test_replayed_whole_swaps_read_what_plain_autograd_reads(lag):
    model, x, engine, profiled, schedule = _profiled_blocks(lag)
    plain = copy.deepcopy(model)
    route = ReplayRoute(profiled.sequence, schedule)
    assert SWAP_WHOLE in route.actions and SWAP_AGAIN in route.actions
    for stats in _replayed_as_plain(engine, model, plain, x, schedule, profiled.sequence, steps=3):
        assert [(layer.name, layer.saved_bytes, layer.swappable_bytes) for layer in stats.layers] == [
            (layer.name, layer.saved_bytes, layer.swappable_bytes) for layer in profiled.layers
        ]
        assert engine.ledger.activation_bytes == 0
    if lag != -1:
        assert engine.runtime.violations == [] and engine.runtime.num_ooms == 0
    engine.close()
    assert engine.pool.in_use_bytes == 0


class HeadsLayout(nn.Module):
    """Attention's layout: a projection viewed as (batch, heads, length, head width) by a
    transpose, then saved by the next op through that view, which covers its whole storage
    but is neither contiguous nor channels-last (as scaled dot-product attention's output is)."""

    def __init__(self, width: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.project = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        h = self.project(x).view(batch, length, self.heads, width // self.heads).transpose(1, 2)
        h = h.square()  # saves the transposed view: all of the projection's storage
        return self.out(h.transpose(1, 2).reshape(batch, length, width)).square().sum()


@pytest.mark.parametrize("lag", [-1, 0, 3, None])
def test_a_whole_storage_saved_through_a_permuted_view_is_replayed_without_a_graph_change(lag):
    torch.manual_seed(0)
    model, x = HeadsLayout(), torch.randn(2, 8, 16)
    engine = _engine(lag)
    profiled = _profile(engine, model, x)
    schedule = _swap_all_but_last(profiled)
    route = ReplayRoute(profiled.sequence, schedule)
    assert SWAP_WHOLE in route.actions
    plain = copy.deepcopy(model)
    passes = list(_replayed_as_plain(engine, model, plain, x, schedule, profiled.sequence, steps=2))
    assert len(passes) == 2
    if lag != -1:
        assert engine.runtime.violations == [] and engine.runtime.num_ooms == 0
    engine.close()


@pytest.mark.parametrize(
    "change",
    [
        "sliced",  # the first save is no longer its whole storage
        "bumped",  # the second save no longer reads what the first saved
    ],
)
def test_a_save_that_no_longer_matches_leaves_the_path_and_reads_what_plain_autograd_reads(change):
    model, x, engine, profiled, schedule = _profiled_blocks(lag=-1)
    setattr(model, change, True)
    plain = copy.deepcopy(model)
    plain_loss = plain(x)
    plain_loss.backward()
    loss, stats = _step(engine, model, x, schedule, profiled.sequence)
    assert stats.graph_changed
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), _grads(plain), strict=True))
    assert engine.ledger.activation_bytes == 0


def test_keep_on_device_in_a_replayed_pass_keeps_what_the_route_would_swap_whole():
    model, x, engine, profiled, schedule = _profiled_blocks(lag=-1)
    with engine.offload(model, schedule, sequence=profiled.sequence), keep_on_device():
        loss = model(x)
    loss.backward()
    stats = engine.end_step()
    assert stats is not None and stats.bytes_swapped_out == 0


class CountingCopies(SimulatedGPU):
    """A simulated GPU that remembers how many copies each copy-out (on the copy stream or in
    compute order) and copy-in call carried."""

    def __init__(self) -> None:
        super().__init__(lag=2, seed=1)
        self.out_groups: list[int] = []
        self.in_groups: list[int] = []

    def copy_out(self, after, sources, hosts):
        self.out_groups.append(len(sources))
        return super().copy_out(after, sources, hosts)

    def copy_out_now(self, sources, hosts):
        self.out_groups.append(len(sources))
        return super().copy_out_now(sources, hosts)

    def copy_in(self, after, hosts, dests):
        self.in_groups.append(len(hosts))
        return super().copy_in(after, hosts, dests)


def test_a_layers_whole_storages_go_out_as_one_group_and_come_back_in_groups():
    # Each LayerNorm saves three storages of its own (its input, mean and rstd): one copy-out
    # call and one event for the three. With a window holding everything, backward brings all
    # back in one call.
    torch.manual_seed(0)
    model, x = Blocks(), torch.randn(8, 16)
    runtime = CountingCopies()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=runtime)
    profiled = _profile(engine, model, x)
    names = [layer.name for layer in profiled.layers]
    schedule = SwapSchedule.swap_layers_named(
        names[:-1], prefetch_window_bytes=2**20, max_copying_out_bytes=1024
    )
    runtime.out_groups.clear(), runtime.in_groups.clear()
    plain = copy.deepcopy(model)
    plain(x).backward()
    _, stats = _step(engine, model, x, schedule, profiled.sequence)
    assert not stats.graph_changed
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), _grads(plain), strict=True))
    norms = sum(
        isinstance(module, nn.LayerNorm) and name in names[:-1] for name, module in model.named_modules()
    )
    assert runtime.out_groups.count(3) == norms
    assert stats.storages_swapped_out == sum(runtime.out_groups) > len(runtime.out_groups)
    assert len(runtime.in_groups) == 1 and runtime.in_groups[0] > norms  # the rest is read in place
    assert runtime.violations == [] and engine.ledger.activation_bytes == 0


class WrittenAfterSave(nn.Module):
    """``exp`` saves its result ``y``, which (when ``write``) is then written in place and dies
    after the forward; the second ``exp`` saves a storage of the same layer after the write.
    Plain autograd refuses the backward (``y`` changed since it was saved). With ``fail`` the
    forward raises between the two saves."""

    def __init__(self) -> None:
        super().__init__()
        self.write = False
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        if self.write:
            y.add_(1.0)
        if self.fail:
            raise RuntimeError("failed between two saves of a group")
        return y.exp().sum()


@pytest.mark.parametrize("lag", [-1, 0, None])
def test_an_in_place_write_before_the_groups_copy_is_refused_as_plain_autograd_refuses_it(lag):
    # The copy of y waits for the layer's next storage, so it would carry the written bytes:
    # its saves no longer match, and backward raises as plain autograd does, even though y is gone.
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 16), WrittenAfterSave()), torch.randn(8, 16)
    engine = _engine(lag)
    profiled = _profile(engine, model, x.clone())
    model[1].write = True
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        model(x).backward()
    model.zero_grad(set_to_none=True)
    schedule = SwapSchedule.swap_layers_named(["1"], prefetch_window_bytes=2**20, max_copying_out_bytes=2**20)
    assert ReplayRoute(profiled.sequence, schedule).actions.count(SWAP_WHOLE) == 2
    with engine.offload(model, schedule, sequence=profiled.sequence):
        loss = model(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("lag", [-1, 0, None])
def test_a_forward_failing_inside_a_group_leaves_nothing_held_and_the_next_step_is_exact(lag):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 16), WrittenAfterSave()), torch.randn(8, 16)
    plain = copy.deepcopy(model)
    plain(x).backward()
    engine = _engine(lag)
    profiled = _profile(engine, model, x)
    schedule = SwapSchedule.swap_layers_named(["1"], prefetch_window_bytes=2**20, max_copying_out_bytes=2**20)
    model[1].fail = True
    with (
        pytest.raises(RuntimeError, match="between two saves"),
        engine.offload(model, schedule, sequence=profiled.sequence),
    ):
        model(x)
    assert not engine.step_open and engine.ledger.activation_bytes == 0
    model[1].fail = False
    _, stats = _step(engine, model, x, schedule, profiled.sequence)
    assert stats.bytes_swapped_out > 0 and not stats.graph_changed
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), _grads(plain), strict=True))
    engine.close()
    assert engine.pool.in_use_bytes == 0
    if lag != -1:
        assert engine.runtime.violations == []


@pytest.mark.parametrize("lag", [-1, 0, None])
def test_a_host_buffer_refused_on_the_whole_path_leaves_nothing_held_and_the_next_step_is_exact(lag):
    model, x, engine, profiled, schedule = _profiled_blocks(lag)
    plain = copy.deepcopy(model)
    plain(x).backward()
    route = ReplayRoute(profiled.sequence, schedule)
    assert route.actions.count(SWAP_WHOLE) > 2  # the refusal comes on the whole path, past its first swaps
    engine.pool.trim()
    engine.pool.capacity_bytes = 2 * engine.pool.host_bytes(1)  # room for two buffers, then refused
    with (
        pytest.raises(HostMemoryExceeded, match="host_memory_limit"),
        engine.offload(model, schedule, sequence=profiled.sequence),
    ):
        model(x)
    assert not engine.step_open and engine.ledger.activation_bytes == 0
    assert engine.pool.in_use_bytes == 0
    engine.pool.capacity_bytes = 2**30
    _, stats = _step(engine, model, x, schedule, profiled.sequence)
    assert stats.bytes_swapped_out > 0 and not stats.graph_changed
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), _grads(plain), strict=True))
    engine.close()
    assert engine.pool.in_use_bytes == 0 and engine.ledger.activation_bytes == 0
    if lag != -1:
        assert engine.runtime.violations == []


class Penalised(nn.Module):
    """Two Linear/ReLU layers and a gradient penalty: a backward inside the forward reads the
    saves of the squares and of the second ReLU."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(width, width), nn.ReLU())
        self.second = nn.Sequential(nn.Linear(width, width), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        out = self.second(h)
        (grad,) = torch.autograd.grad(out.square().sum(), h, create_graph=True)
        return out.square().sum() + grad.square().sum()


@pytest.mark.parametrize("lag", [-1, 0, 3, None])
def test_a_whole_storage_read_by_a_backward_inside_a_replayed_forward_is_reported_kept(lag):
    torch.manual_seed(0)
    model, x = Penalised(), torch.randn(8, 16)
    plain = copy.deepcopy(model)
    plain(x).backward()
    engine = _engine(lag)
    profiled = _profile(engine, model, x)
    names = [layer.name for layer in profiled.layers]
    schedule = SwapSchedule.swap_layers_named(names, prefetch_window_bytes=256, max_copying_out_bytes=0)
    assert SWAP_WHOLE in ReplayRoute(profiled.sequence, schedule).actions
    for _ in range(2):
        loss, stats = _step(engine, model, x, schedule, profiled.sequence)
        assert not stats.graph_changed and stats.bytes_swapped_out > 0
        assert all(torch.equal(a, b) for a, b in zip(_grads(model), _grads(plain), strict=True))
        # What the penalty read stays on the device all step: reported not swappable, as profiled.
        assert [(layer.name, layer.saved_bytes, layer.swappable_bytes) for layer in stats.layers] == [
            (layer.name, layer.saved_bytes, layer.swappable_bytes) for layer in profiled.layers
        ]
        assert engine.ledger.activation_bytes == 0
        model.zero_grad(set_to_none=True)
    assert any(layer.swappable_bytes < layer.saved_bytes for layer in profiled.layers)
    if lag != -1:
        assert engine.runtime.violations == [] and engine.runtime.num_ooms == 0
    engine.close()
    assert engine.pool.in_use_bytes == 0
