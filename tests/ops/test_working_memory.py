"""A hooked pass measures, level by level, what the step holds beyond the engine's ledger: a
temporary in a layer's forward, a gradient's workspace in a layer's backward, the optimizer's
temporaries between passes. CPU: the allocator is the ops' own tensors
(:class:`~lightning_accudnn.testing.OpBytesAllocator`)."""

import pytest
import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.ops.ledger import ObservedLedger
from lightning_accudnn.testing import OpBytesAllocator

SCRATCH = 400_000  # bytes a layer holds and lets go without saving them: more than all else


class ScratchInForward(nn.Module):
    """Holds ``nbytes`` of scratch in its forward, after the layers before it saved."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.nbytes:
            scratch = torch.ones(self.nbytes // 4)
            x = x + scratch[:1]  # read, then let go
        return x


class _ScratchInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, nbytes):  # type: ignore[no-untyped-def]
        ctx.nbytes = nbytes
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        if ctx.nbytes:
            scratch = torch.ones(ctx.nbytes // 4)
            grad = grad + scratch[:1]
        return grad, None


class ScratchInBackward(nn.Module):
    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ScratchInBackward.apply(x, self.nbytes)


def _model(forward_scratch: int = 0, backward_scratch: int = 0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64),
        nn.ReLU(),
        ScratchInForward(forward_scratch),
        ScratchInBackward(backward_scratch),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, 1),
    )


def _measured_pass(model: nn.Module, between: int = 0, passes: int = 2):
    """The last of ``passes`` hooked passes of ``model``, keeping everything, with the ops'
    tensors as the allocator; ``between`` bytes are held and let go between passes."""
    allocator = OpBytesAllocator(base_bytes=0)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=2**40)
    read = allocator.allocated_peak_reader()
    stats = None
    for _ in range(passes):
        with allocator.counting():
            if between:
                torch.ones(between // 4).sum()  # an optimizer's temporary, say
            batch = torch.randn(16, 32)
            with engine.offload(model, SwapSchedule.keep_everything(), allocated_peak=read):
                loss = model(batch).sum()
            loss.backward()
            stats = engine.end_step()
    engine.close()
    assert stats is not None and not isinstance(engine.ledger, ObservedLedger)
    return stats


def _working(stats):
    return {layer.name: (layer.forward_working_bytes, layer.backward_working_bytes) for layer in stats.layers}


def _others(working, layer: str):
    """``working`` (see :func:`_working`) of every layer but ``layer``."""
    return {name: value for name, value in working.items() if name != layer}


def test_a_temporary_in_forward_is_charged_to_the_level_it_falls_in_and_no_other():
    plain = _working(_measured_pass(_model()))
    with_scratch = _working(_measured_pass(_model(forward_scratch=SCRATCH)))
    # The scratch module saves nothing: the last layer to have saved before it is the ReLU. Its
    # level's working memory is the most of its readings, the one with the scratch among them.
    assert SCRATCH <= with_scratch["1"][0] <= plain["1"][0] + SCRATCH
    assert _others(with_scratch, "1") == _others(plain, "1")
    assert with_scratch["1"][1] == plain["1"][1]


def test_a_temporary_in_backward_is_charged_to_the_backward_running_then():
    plain = _working(_measured_pass(_model()))
    with_scratch = _working(_measured_pass(_model(backward_scratch=SCRATCH)))
    # It runs after the second Linear's backward read that layer's saves, before the ReLU's.
    assert SCRATCH <= with_scratch["4"][1] <= plain["4"][1] + SCRATCH
    assert _others(with_scratch, "4") == _others(plain, "4")


def test_what_is_held_between_passes_is_the_outside_working_memory():
    """Beyond model state: the engine here counts none, so the gradients (made in the first
    backward) are in both; the temporary between the passes is the most held then."""
    between = _measured_pass(_model(), between=SCRATCH).outside_working_bytes
    assert SCRATCH <= between <= _measured_pass(_model()).outside_working_bytes + SCRATCH


def test_a_loss_holds_its_logits_and_their_gradients_at_its_own_levels():
    """Cross-entropy over logits no layer saves: the logits are held in forward at the level
    of the last layer that saved before the loss (the Tanh: the last Linear saves only the Tanh's
    output again), and the loss's backward (the root's: the training step's own code) holds two
    logit-sized gradients at least on top of what the loss saved."""
    torch.manual_seed(0)
    batch, classes = 64, 1000
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, classes))
    allocator = OpBytesAllocator()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=2**40)
    for _ in range(2):
        with allocator.counting():
            inputs, targets = torch.randn(batch, 32), torch.randint(0, classes, (batch,))
            schedule = SwapSchedule.keep_everything()
            with engine.offload(model, schedule, allocated_peak=allocator.allocated_peak_reader()):
                loss = nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            stats = engine.end_step()
    engine.close()
    working = _working(stats)
    logits = batch * classes * 4
    assert [layer.name for layer in stats.layers][-1] == "(root)"
    assert "2" not in working  # it saves nothing new
    assert working["1"][0] >= logits  # the logits, before the loss saved its log-softmax
    assert working["(root)"][1] >= 2 * logits


@pytest.mark.parametrize("replayed", [False, True])
def test_no_reader_or_a_replayed_pass_measures_nothing(replayed):
    model = _model(forward_scratch=SCRATCH, backward_scratch=SCRATCH)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=2**40)
    calls = []

    def read() -> int:
        calls.append(1)
        return 0

    sequence = None
    for _ in range(2):
        with engine.offload(
            model,
            SwapSchedule.keep_everything(),
            sequence=sequence,
            allocated_peak=read if replayed else None,
        ):
            loss = model(torch.randn(16, 32)).sum()
        assert not isinstance(engine.ledger, ObservedLedger) or (replayed and sequence is None)
        loss.backward()
        stats = engine.end_step()
        assert stats is not None
        sequence = stats.sequence if replayed else None
        calls_after_first = len(calls)
    engine.close()
    assert all(layer.forward_working_bytes == layer.backward_working_bytes == 0 for layer in stats.layers)
    assert stats.outside_working_bytes == 0
    if replayed:  # the first, hooked pass read; the replayed one did not
        assert calls_after_first == len(calls) > 0


def test_an_aborted_pass_stops_observing_the_ledger():
    model = _model()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=2**40)
    schedule = SwapSchedule.keep_everything()
    with pytest.raises(RuntimeError, match="boom"), engine.offload(model, schedule, allocated_peak=lambda: 0):
        model(torch.randn(16, 32)).sum()
        assert isinstance(engine.ledger, ObservedLedger)
        raise RuntimeError("boom")
    assert not isinstance(engine.ledger, ObservedLedger)
    engine.close()


class _Storage:
    """A stand-in for the engine's weak reference to a storage."""

    def __init__(self) -> None:
        self.alive = True

    def expired(self) -> bool:
        return not self.alive


def test_a_storage_held_beyond_the_forward_is_a_kept_save_not_working_memory():
    """``a``'s 100 swapped bytes stay alive (held: the batch), ``b``'s 50 die in backward. Plans
    keep ``a``: it is no retired-alive memory of a plan that swaps, and in backward it is off the
    unseen bytes until the copy brought back, read for the last time, dies."""
    from lightning_accudnn.ops.working_memory import WorkingMemoryMeter

    readings = iter([0, 0, 100, 150, 150, 180, 140, 200, 210, 260, 100, 100])
    layer = ["a"]
    meter = WorkingMemoryMeter(lambda: next(readings), lambda: layer[0])
    held, dying, copy = _Storage(), _Storage(), _Storage()
    meter.start(0)
    meter.changing(0)
    meter.acquired(100)
    meter.saved("a")
    meter.changing(100)  # a's copy is out: the engine lets it go, the caller holds it
    meter.released(100)
    meter.retired(100, held, "held", "a")
    layer[0] = "b"
    meter.changing(0)  # b's output, 50 bytes, before b saves it
    meter.acquired(50)
    meter.saved("b")
    meter.changing(50)
    meter.released(50)
    meter.retired(50, dying, "dying", "b")
    meter.begin_backward(0, ["a", "b"], {"held"}, 100)  # 30 bytes of the loss's beyond them
    dying.alive = False
    meter.read("b", 0)
    meter.allocating(0)  # 40 bytes of b's gradient beside the held 100
    meter.acquired(100)
    meter.changing(100)  # the copy of a, allocated: the ledger's
    meter.read("a", 100)  # b's backward is over: 10 bytes beyond the original and the copy
    meter.held_read(100, copy)
    meter.changing(100)  # a's backward: 60 bytes of gradient; the copy stands for the original
    copy.alive = False
    meter.changing(100)  # the copy died: the original alone, as a plan keeping it lets it go
    meter.released(100)
    memory = meter.end(0, ["a", "b"])
    assert memory.retired_alive_bytes == {"b": 50}  # the held 100 left out
    assert memory.retired_alive_from == {"b": {"b": 50}}  # b's own storage (a's is held)
    assert memory.forward_bytes == {"a": 50, "b": 30}
    assert memory.backward_bytes == {"a": 60, "b": 40}


class _SavesItsInput(torch.autograd.Function):
    """Saves its input (another layer's output: a save again of that layer's storage) and holds
    ``nbytes`` of scratch in its backward."""

    @staticmethod
    def forward(ctx, x, nbytes):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        ctx.nbytes = nbytes
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        scratch = torch.ones(ctx.nbytes // 4) if ctx.nbytes else torch.zeros(1)
        return grad * 2.0 + 0.0 * x + scratch[:1], None


class SavesItsInput(nn.Module):
    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SavesItsInput.apply(x, self.nbytes)


def test_the_backward_of_a_layer_saving_an_earlier_layers_output_is_charged_to_its_own_level():
    """The middle module saves only the first Tanh's output, again: its backward runs after the
    second Tanh's and before the first's, and reads that save. It is charged to the level its
    own saves would fall in (the second Tanh's, the next to save), not to the first Tanh's,
    whose backward has not begun (a recomputed segment there holds its rebuilt saves then)."""

    def model(nbytes: int) -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), SavesItsInput(nbytes), nn.Tanh(), nn.Linear(64, 1))

    plain = _working(_measured_pass(model(0)))
    with_scratch = _working(_measured_pass(model(SCRATCH)))
    assert "2" not in plain, "the middle module saves nothing of its own"
    assert SCRATCH <= with_scratch["3"][1] <= plain["3"][1] + SCRATCH
    assert with_scratch["1"] == plain["1"]


@pytest.mark.parametrize(
    ("case", "expected"),
    [("window refilled", 60), ("window left empty", 60), ("kept save let go", 30)],
)
def test_room_freed_in_the_prefetch_window_is_not_taken_off_the_working_memory(case, expected):
    """b's 50 bytes leave the ledger in b's backward, and b's level counts them. A kept save let go
    is still held by the op reading it: taken off what the allocator holds beyond the ledger (then
    10 bytes beyond, below the 30 held before). Room freed in the prefetch window is not, whether
    the engine fills it again with a's copy at once (the level counts that copy in its place) or
    later: b's backward holds 60 bytes beyond its level."""
    from lightning_accudnn.ops.working_memory import WorkingMemoryMeter

    refilled = case == "window refilled"
    peaks = iter([100, 100, 150, 200, 230, *((180, 230, 260) if refilled else (210,)), 260])
    layer = ["a"]
    meter = WorkingMemoryMeter(lambda: next(peaks), lambda: layer[0])
    meter.start(100)
    for name, ledger in (("a", 100), ("b", 150)):
        layer[0] = name
        meter.changing(ledger)
        meter.acquired(50)
        meter.saved(name)
    meter.begin_backward(200, ["a", "b"])
    meter.read("b", 200)
    meter.changing(200)
    meter.released(50)
    if case != "kept save let go":
        meter.window_freed(50)
    if refilled:
        meter.allocating(150)  # a's copy, in the room b left
        meter.changing(150)
        meter.acquired(50)
    ledger = 200 if refilled else 150
    meter.read("a", ledger)
    memory = meter.end(ledger, ["a", "b"])
    assert memory.backward_bytes["b"] == expected


def test_each_backward_level_lists_the_gradients_the_backward_had_not_made_at_its_readings():
    """The gradients are model state the device holds only once the backward makes them. The
    Tanh's level (the last Linear's backward, which reads its output) is read with none made;
    the middle Linear's with its own and the first's to come; the ReLU's and the first Linear's
    with the first's alone (autograd accumulates a gradient as soon as it is computed)."""
    model = _model()
    first, middle, last = (sum(p.numel() * 4 for p in model[i].parameters()) for i in (0, 4, 6))
    allocator = OpBytesAllocator(base_bytes=0)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=2**40)
    with allocator.counting():
        with engine.offload(
            model, SwapSchedule.keep_everything(), allocated_peak=allocator.allocated_peak_reader()
        ):
            loss = model(torch.randn(16, 32)).sum()
        loss.backward()
        stats = engine.end_step()
    engine.close()
    assert stats is not None
    to_come = {layer.name: layer.backward_static_not_held_bytes for layer in stats.layers}
    assert to_come == {"0": first, "1": first, "4": first + middle, "5": first + middle + last}
