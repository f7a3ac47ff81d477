"""Passes replayed unobserved: a sequence whose every save the schedule keeps may run
with no saved-tensor hook at all (nothing per saved tensor). The engine only does so once it
observed a pass of the sequence under the schedule; the step then reports that pass's layers
and ledger peak. A schedule that swaps passes the hooks only up to the last save through the
engine's records."""

import copy

import torch
from torch import nn

from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.ops.layers import SaveSequence
from lightning_accudnn.ops.replay import ReplayRoute


def _deep(width: int = 32, depth: int = 5) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    return nn.Sequential(*layers)


class _CountingHooks:
    """Outer saved-tensor hooks: autograd calls the innermost pair only, so these count the
    saves that no engine hook intercepted."""

    def __init__(self) -> None:
        self.packed = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.packed += 1
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _pass(engine, model, x, schedule, sequence=None, observe=True):
    outer = _CountingHooks()
    with (
        torch.autograd.graph.saved_tensors_hooks(outer.pack, outer.unpack),
        engine.offload(model, schedule, sequence=sequence, observe=observe),
    ):
        loss = model(x).square().sum()
    loss.backward()
    stats = engine.end_step()
    assert stats is not None
    return stats, outer.packed


def _profiled() -> tuple[OffloadEngine, nn.Module, torch.Tensor, SaveSequence]:
    """An engine, the model and batch it profiled keeping everything, and the recorded sequence."""
    torch.manual_seed(0)
    model = _deep()
    x = torch.randn(4, 32)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    sequence = _pass(engine, model, x, SwapSchedule.keep_everything())[0].sequence
    assert sequence is not None
    return engine, model, x, sequence


def test_a_kept_sequence_runs_unobserved_once_observed_and_reports_the_observed_figures():
    torch.manual_seed(0)
    model = _deep()
    plain = copy.deepcopy(model)
    x = torch.randn(4, 32)
    keep = SwapSchedule.keep_everything()
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    profiled, _ = _pass(engine, model, x, keep)
    sequence = profiled.sequence
    plain(x).square().sum().backward()

    observed, observed_peak = [], None
    for _ in range(4):
        stats, seen_by_outer = _pass(engine, model, x, keep, sequence, observe=False)
        plain(x).square().sum().backward()
        observed.append(stats.observed)
        # Observed: the engine's hooks took every save; unobserved: none did.
        assert seen_by_outer == (0 if stats.observed else len(sequence))
        assert not stats.graph_changed and not stats.timed
        assert [(layer.name, layer.saved_bytes) for layer in stats.layers] == [
            (layer.name, layer.saved_bytes) for layer in profiled.layers
        ]
        assert engine.ledger.activation_bytes == 0
        if stats.observed:
            observed_peak = stats.ledger_peak_bytes
        else:
            assert stats.ledger_peak_bytes == observed_peak
    assert observed == [True, False, False, False]  # the first replay under the schedule is observed
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    engine.close()


def _swapping_first(sequence: SaveSequence, layers: int) -> SwapSchedule:
    """A schedule swapping the first ``layers`` saving layers of ``sequence``, in forward order."""
    return SwapSchedule.swap_layers_named(list(dict.fromkeys(sequence.layers))[:layers], 2**20, 2**10)


def test_a_schedule_that_swaps_unobserved_passes_the_hooks_up_to_its_last_recorded_save():
    """Unobserved, a swapping schedule's hooks go once its last save through the records is
    packed: the saves after it (kept) pass no engine hook. The step swaps what an observed one
    does, reports the observed pass's layers and peak, and backward is bitwise the same."""
    torch.manual_seed(0)
    model = _deep()
    plain = copy.deepcopy(model)
    x = torch.randn(4, 32)
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    sequence = _pass(engine, model, x, SwapSchedule.keep_everything())[0].sequence
    assert sequence is not None
    plain(x).square().sum().backward()
    swap = _swapping_first(sequence, 4)
    route = ReplayRoute(sequence, swap)
    unseen = len(sequence) - route.last_recorded - 1
    assert 0 < unseen < len(sequence) and all(route.fast[route.last_recorded + 1 :])

    passes = [_pass(engine, model, x, swap, sequence, observe=False) for _ in range(3)]
    for _ in passes:
        plain(x).square().sum().backward()
    (observed, outer_observed), *unobserved = passes
    assert observed.observed and outer_observed == 0
    for stats, seen_by_outer in unobserved:
        assert not stats.observed and not stats.graph_changed
        assert seen_by_outer == unseen
        assert stats.bytes_swapped_out == observed.bytes_swapped_out > 0
        assert stats.bytes_swapped_in == observed.bytes_swapped_in > 0
        assert stats.storages_swapped_out == observed.storages_swapped_out
        assert stats.ledger_peak_bytes == observed.ledger_peak_bytes
        assert stats.layers == observed.layers
    assert engine.ledger.activation_bytes == 0 and not engine.step_open
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    engine.close()


def test_unobserved_swapping_passes_leave_no_engine_hook_behind():
    engine, model, x, sequence = _profiled()
    swap = SwapSchedule.swap_everything(max_copying_out_bytes=0)
    last = ReplayRoute(sequence, swap).last_recorded
    for _ in range(3):
        stats, seen_by_outer = _pass(engine, model, x, swap, sequence, observe=False)
        assert seen_by_outer == len(sequence) - last - 1 and stats.bytes_swapped_out > 0
    # After every pass the engine's hooks are gone: a forward outside the engine opens no step.
    model(x).square().sum().backward()
    assert not engine.step_open and engine.ledger.activation_bytes == 0
    engine.close()


def test_a_forward_failing_before_the_hooks_go_leaves_none_and_aborts_the_step():
    engine, model, x, sequence = _profiled()
    swap = _swapping_first(sequence, 4)
    _pass(engine, model, x, swap, sequence)  # observed: the next may skip its tail

    class Failing(Exception):
        pass

    try:
        with engine.offload(model, swap, sequence=sequence, observe=False):
            model[:2](x)  # saves through the records, then fails before the last one
            raise Failing
    except Failing:
        pass
    assert not engine.step_open and engine.ledger.activation_bytes == 0
    model(x).square().sum().backward()  # outside the engine: no hook of it may see this pass
    assert not engine.step_open and engine.ledger.activation_bytes == 0
    # The engine is usable: the next pass is unobserved again and swaps as before.
    stats, seen_by_outer = _pass(engine, model, x, swap, sequence, observe=False)
    assert not stats.observed and stats.bytes_swapped_out > 0 and seen_by_outer > 0
    engine.close()


def test_a_graph_that_departs_before_the_last_recorded_save_keeps_the_hooks_to_the_end():
    """A departure from the sequence before the hooks would go: every later save passes the
    engine (through its filter), the step reports the change, and nothing is left unseen."""
    engine, model, x, sequence = _profiled()
    swap = _swapping_first(sequence, 4)
    _pass(engine, model, x, swap, sequence)
    stats, seen_by_outer = _pass(engine, model, torch.randn(6, 32), swap, sequence, observe=False)
    assert stats.graph_changed and stats.observed and seen_by_outer == 0
    engine.close()


def test_a_change_after_the_last_recorded_save_shows_at_the_next_observed_pass():
    """What runs after the hooks went is not seen (as in a pass with no hook at all): a graph
    that grows there replays unobserved as if unchanged, and the next observed pass reports it."""
    engine, model, x, sequence = _profiled()
    swap = _swapping_first(sequence, 4)
    _pass(engine, model, x, swap, sequence)
    longer = nn.Sequential(*model, nn.Tanh())  # the same layers, then one more save
    unseen, _ = _pass(engine, longer, x, swap, sequence, observe=False)
    assert not unseen.observed and not unseen.graph_changed and unseen.bytes_swapped_out > 0
    seen, _ = _pass(engine, longer, x, swap, sequence)
    assert seen.observed and seen.graph_changed
    engine.close()


def test_a_new_schedule_or_a_changed_graph_is_observed_again_before_running_unobserved():
    engine, model, x, sequence = _profiled()
    keep = SwapSchedule.keep_everything()
    assert _pass(engine, model, x, keep, sequence, observe=False)[0].observed
    assert not _pass(engine, model, x, keep, sequence, observe=False)[0].observed
    # A pass observed with another batch size departs from the sequence: the next may not skip.
    changed, _ = _pass(engine, model, torch.randn(6, 32), keep, sequence)
    assert changed.graph_changed
    assert _pass(engine, model, x, keep, sequence, observe=False)[0].observed
    assert not _pass(engine, model, x, keep, sequence, observe=False)[0].observed
    # Another schedule (that still keeps everything) is a new route: observed first.
    other = SwapSchedule.keep_layers_named(sorted(set(sequence.layers)))
    assert _pass(engine, model, x, other, sequence, observe=False)[0].observed
    assert not _pass(engine, model, x, other, sequence, observe=False)[0].observed
    engine.close()


def test_a_hooked_pass_asked_to_skip_the_hooks_still_records():
    """observe=False without a sequence (a profiling pass) is observed: there is nothing to replay."""
    engine, model, x, sequence = _profiled()
    keep = SwapSchedule.keep_everything()
    _pass(engine, model, x, keep, sequence)  # an observed replay: the route may now skip the hooks
    assert not _pass(engine, model, x, keep, sequence, observe=False)[0].observed
    stats, seen_by_outer = _pass(engine, model, x, keep, observe=False)
    assert stats.observed and stats.timed and stats.sequence is not None and seen_by_outer == 0
    engine.close()
