"""The offload engine: saved-tensor hooks that swap activations out in forward and back in backward.

Device memory follows GPU (stream) order, never CPU timing: a swapped storage's device
bytes are held in an in-flight FIFO after its copy out is enqueued and dropped only after
the compute stream waited on that copy (when the schedule's copy-out limit needs the room,
or when backward consumes it); copies back land in memory allocated on the compute stream;
nothing polls or synchronizes the device. So the ledger (and the allocator) follow a
deterministic function of the model and the schedule, however far the CPU runs ahead.

The engine is one object in layers, each in its module: :class:`.CopyTraffic`
(:mod:`.transfers`: the copy-out FIFO, prefetching, release), :class:`.SaveRecords` and
:class:`.SaveHooks` (:mod:`.pack`: the filter, the records, the pack and unpack hooks and the
replayed fast path), and :class:`OffloadEngine` here (the step: open, backward, end, abort),
which reports through :mod:`.recording`. The handles autograd holds and the step's
bookkeeping are in :mod:`.saves`.

Usage from a plain PyTorch loop (Lightning's strategy does the same)::

    engine = OffloadEngine(device=torch.device("cuda"))
    for x, y in loader:
        with engine.offload(model, SwapSchedule.swap_everything()):
            loss = loss_fn(model(x), y)
        loss.backward()
        stats = engine.end_step()
        optimizer.step(); optimizer.zero_grad()
    engine.close()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from lightning_accudnn.ops.gradient_arrivals import GradientArrivals
from lightning_accudnn.ops.layers import SaveSequence
from lightning_accudnn.ops.ledger import ObservedLedger
from lightning_accudnn.ops.pack import CHANGED_GRAPH_LAYER, SaveHooks, keep_on_device
from lightning_accudnn.ops.recording import ReplayedLayers, StepStats, layer_usage
from lightning_accudnn.ops.replay import ReplayRoute
from lightning_accudnn.ops.runtime import Runtime, make_runtime
from lightning_accudnn.ops.saves import StepState
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.ops.timing import HostWorkTimer, WallClock
from lightning_accudnn.ops.transfers import COPY_GROUP_BYTES, COPY_GROUP_STORAGES
from lightning_accudnn.ops.working_memory import WorkingMemory, WorkingMemoryMeter
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES

__all__ = [
    "CHANGED_GRAPH_LAYER",
    "COPY_GROUP_BYTES",
    "COPY_GROUP_STORAGES",
    "OffloadEngine",
    "StepStats",
    "keep_on_device",
]


class OffloadEngine(SaveHooks):
    """Swaps saved activations of chosen layers to host memory and prefetches them back.

    Inside :meth:`offload`, every tensor autograd saves passes a filter (on the engine's
    device, a plain strided tensor, not a parameter, buffer or view of one) and is
    attributed to the layer running now. Storages of at least ``min_swap_bytes`` in layers
    the :class:`SwapSchedule` names, outside excluded modules and :func:`keep_on_device`,
    are copied to pooled host buffers on the runtime's copy stream; their device bytes are
    held in an in-flight FIFO and dropped, oldest first, once the compute stream waited on
    their copy, whenever the FIFO holds more than ``max_copying_out_bytes`` and more than
    one storage. In backward the engine brings swapped storages back in reverse order of
    their last save into memory allocated on the compute stream, within the schedule's
    prefetch window, and the compute waits only for data it reads now. ``runtime`` is the
    device (see :mod:`.runtime`); by default CUDA streams on a GPU and host copies on CPU.

    Example:
        >>> model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
        >>> with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        ...     loss = model(torch.randn(32, 64)).sum()
        >>> loss.backward()
        >>> engine.end_step().bytes_swapped_out > 0
        True
        >>> engine.close()
    """

    def __init__(
        self,
        device: torch.device,
        *,
        min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES,
        exclude: Iterable[str] = (),
        host_memory_limit: int = 2**62,
        runtime: Runtime | None = None,
    ) -> None:
        super().__init__(
            runtime if runtime is not None else make_runtime(device),
            host_memory_limit,
            min_swap_bytes,
            exclude,
        )
        self._storages_model: object = None  # the model ``_model_storages`` belongs to
        self._replayed_layers = ReplayedLayers()  # the last replayed pass's report
        self._last_observed: tuple[ReplayRoute, int] | None = None  # an observed replay: its activation peak
        self._hooked = False
        self._time_waits = False  # the pass replayed now times its waits, read at its end
        # ... and its own host work, by this timer (which passes the waits on to pass_timer)
        self._host_work = HostWorkTimer(
            self.pass_timer, host_marks=isinstance(self.pass_timer.clock, WallClock)
        )
        # Autocast was still on when the forward ended: its cache may hold weight copies beyond it.
        self._autocast_past_forward = False

    # -- the step -------------------------------------------------------------------

    @contextmanager
    def offload(
        self,
        model: nn.Module,
        schedule: SwapSchedule,
        static_bytes: int = 0,
        sequence: SaveSequence | None = None,
        *,
        observe: bool = True,
        time_waits: bool = False,
        allocated_peak: Callable[[], int] | None = None,
    ) -> Iterator[None]:
        """Run the forward passes inside under ``schedule``; the first saved tensor opens a step.

        Without ``sequence`` every module is hooked and timed, and the step's
        :attr:`StepStats.sequence` records who saved what. With the ``sequence`` of an
        earlier pass of the same graph no module hook is installed and nothing is timed: each
        saved tensor is attributed by its ordinal, and a save that departs from the sequence
        marks the step ``graph_changed`` (its saves then count under
        :data:`CHANGED_GRAPH_LAYER`, which a plan swaps). The parameters' storages are
        re-read in hooked passes and whenever the model object changes.

        With ``observe=False`` and a ``sequence``, the pass is replayed unobserved: the hooks
        stay only up to the last save the schedule has the engine's records take
        (:attr:`.ReplayRoute.last_recorded`: the last swapped one), and autograd keeps every
        later save as it does without the engine, which costs nothing per saved tensor. A
        schedule that keeps everything thus installs no hook at all; one that swaps the
        first layers of the forward pays for the hooks of those layers only. The step then
        reports the layers and the ledger peak of the last observed pass of that sequence
        under that schedule (:attr:`StepStats.observed` false), and a changed graph after the
        hooks went goes unseen until a pass is observed again: the caller observes one now
        and then. The engine observes anyway when it has observed no pass of the sequence
        under the schedule yet, and keeps the hooks to the end of a pass that departs from
        the sequence before its last recorded save. An unobserved block holds one pass:
        after :meth:`end_step` inside it, nothing more is seen (the next :meth:`end_step`
        returns ``None``).

        ``static_bytes`` (model state) starts the ledger of each step opened inside. The
        block may hold backward passes too (Lightning's manual optimization): call
        :meth:`begin_backward` before each, and :meth:`end_step` after. On leaving the block
        normally the forward is over and prefetching starts; on an exception the step is
        aborted: hooks removed, host buffers back in the pool.

        With ``time_waits`` a pass replayed by ordinal also times compute's waits on copies,
        and its times are read at its end, the CPU waiting for the device: its
        :attr:`StepStats.stall_seconds` say how much of its forward and backward was waiting,
        and its :attr:`StepStats.swap_host_seconds` how long the host spent in the engine's
        own work.

        With ``allocated_peak`` (the device allocator's peak of allocated bytes since its previous
        call) a hooked pass measures what it holds beyond the ledger, layer by layer
        (:mod:`.working_memory`): its layers' ``forward_working_bytes`` and
        ``backward_working_bytes``, and the step's :attr:`StepStats.outside_working_bytes`; and
        the parameters' gradients not made yet (model state, where ``static_bytes`` counts them)
        when the pass began (:attr:`StepStats.gradients_to_come_bytes`) and at each layer's
        backward readings (its ``backward_static_not_held_bytes``).
        """
        if self._hooked:
            raise RuntimeError("OffloadEngine.offload is not re-entrant: a forward pass is already hooked")
        self._schedule = schedule
        self._static_bytes = static_bytes
        if self._step is None:  # a new step
            self._autocast_past_forward = False
        index = self.device.index
        self._device_index = -1 if self.device.type == "cpu" else index if index is not None else 0
        if sequence is None or model is not self._storages_model:
            self._model_storages = _storages_of(model)
            self._model_pointers = _pointers_of(model)
            self._storages_model = model
        self._replaying = sequence
        self._recording = SaveSequence() if sequence is None else None
        # No timing events in passes replayed by ordinal, unless their waits are to be timed.
        self.runtime.timing = sequence is None or time_waits
        self._time_waits = time_waits and sequence is not None
        self.runtime.stalls = (
            self.timer if sequence is None else self._host_work if self._time_waits else self.pass_timer
        )
        if self._time_waits and self._step is None:
            self._host_work.start()
        self.runtime.begin_pass()
        if sequence is not None and not self._route.compiled_for(sequence, schedule):
            self._route = ReplayRoute(sequence, schedule)
        self._restart_ordinals()
        # Only a replayed pass may skip saves (a hooked pass records; the route is this one's).
        unobserved = not observe and sequence is not None and self._observed_peak(self._route) is not None
        route = self._route
        self._unhook_after = route.last_recorded if unobserved else -1
        hooks = None
        if unobserved and self._unhook_after < 0:  # it keeps everything: no hook at all
            self._calls = len(route)  # as if every save was seen: the step reports them all
            self._open_step().observed = False
        else:
            pack = self._pack_recorded if sequence is None else self._pack_replayed
            unpack = self._unpack
            if self._time_waits:  # the engine's host time is timed too, its hooks' and its copies'
                pack, unpack = self._host_work.timed(pack), self._host_work.timed(unpack)
            hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        if self._step is None and sequence is None:
            self.timer.start()
        if sequence is None and allocated_peak is not None and self._step is None:
            tracker = self.tracker
            arrivals = self._arrivals = GradientArrivals(model.parameters())
            self._meter = WorkingMemoryMeter(
                allocated_peak, lambda: tracker.current, lambda: arrivals.to_come_bytes
            )
            self._meter.start(static_bytes)
            self.ledger = ObservedLedger(self.ledger, self._meter)
        self._hooked = True
        try:
            with self.tracker.attached(model) if sequence is None else nullcontext():
                if hooks is not None:
                    hooks.__enter__()
                    self._saved_tensor_hooks = hooks
                try:
                    yield
                finally:
                    self._unhook()
        except BaseException:
            self.abort_step()
            raise
        finally:
            self._hooked = False
        self.begin_backward()

    def begin_backward(self) -> None:
        """The forward pass is over: start prefetching.

        Swapped storages come back in reverse order of their last save: one saved by
        several layers (a block's input, saved by the block before and by its first
        convolution and downsample) is needed when backward reaches the last of them.
        Storages still in the copy-out FIFO stay on the device and are used from there.
        """
        self._in_forward = False
        device_type = self.device.type
        if torch.amp.is_autocast_available(device_type):
            self._autocast_past_forward |= torch.is_autocast_enabled(device_type)
        self.runtime.begin_pass()
        issue_copies_out, prefetch = self._issue_copies_out, self._prefetch
        if self._time_waits:
            issue_copies_out, prefetch = (
                self._host_work.timed(issue_copies_out),
                self._host_work.timed(prefetch),
            )
        issue_copies_out()
        step, recording = self._step, self._recording
        if recording is not None and step is not None:  # a hooked pass: what it swapped and the model holds
            held, held_bytes = self._keep_held_storages(step, recording)
            if self._meter is not None:
                layers = tuple(step.layer_saved)
                self._meter.begin_backward(self.ledger.current_bytes, layers, held, held_bytes)
        elif self._meter is not None:  # a hooked pass that saved nothing
            self._meter.begin_backward(self.ledger.current_bytes, ())
        self.timer.end_forward()
        self.pass_timer.end_forward()
        self._host_work.end_forward()
        if step is not None:
            step.swapped.sort(key=lambda record: record.last_save)
            step.next_prefetch = len(step.swapped) - 1
        prefetch()

    def _release_step(self, step: StepState) -> None:
        """The step's backward is over: what it holds on the device goes, in stream order."""
        while step.copying_out:
            self._retire(step, step.copying_out.popleft())
        if step.held_records:
            self._release_devices(step)
        if self._lingering:
            self._reap()
        self._release_lingering()
        self._release_kept(step)

    def end_step(self) -> StepStats | None:
        """Close the step after backward and report what was measured.

        What is still in the copy-out FIFO is dropped after the compute stream waited on its
        copy (stream order; the CPU does not wait). Returns ``None`` when no step is open
        (nothing was saved since the last call).
        """
        step = self._step
        if step is None:
            return None
        self._in_forward = False
        self.timer.end_backward()
        working = self._stop_measuring(step)
        (self._host_work.timed(self._release_step) if self._time_waits else self._release_step)(step)
        replaying, recording = self._replaying, self._recording
        graph_changed = replaying is not None and (self._departed >= 0 or self._calls != len(replaying))
        if step.observed and replaying is not None:
            self._last_observed = None if graph_changed else (self._route, self.ledger.peak_activation_bytes)
        elif not step.observed:
            peak = self._observed_peak(self._route)
            assert peak is not None
            self.ledger.peak_activation_bytes = peak
        if recording is not None:
            layers = layer_usage(step, self.timer, self.tracker, working)
            forward_seconds = sum(layer.forward_seconds for layer in layers)
            backward_seconds = sum(layer.backward_seconds for layer in layers)
        else:
            end = self._departed if self._departed >= 0 else self._calls
            layers = self._replayed_layers.layers(self._route, end, step)
            forward_seconds, backward_seconds = self.pass_timer.end_backward(wait=self._time_waits)
        stalls = self.pass_timer.stalls_read if self._time_waits else (0.0, 0.0)
        stats = StepStats(
            bytes_swapped_out=step.bytes_out,
            bytes_swapped_in=step.bytes_in,
            wait_seconds=self.runtime.collect_wait_seconds(),
            ledger_peak_bytes=self.ledger.peak_bytes,
            swapped_layers=len({record.layer for record in step.swapped}),
            forward_seconds=forward_seconds,
            backward_seconds=backward_seconds,
            layers=layers,
            timed=recording is not None,
            sequence=recording,
            graph_changed=graph_changed,
            layers_read_in_forward=frozenset(step.layers_read_in_forward),
            observed=step.observed,
            storages_swapped_out=len(step.swapped),
            stall_seconds=stalls,
            swap_host_seconds=self._host_work.read() if self._time_waits else (0.0, 0.0),
            outside_working_bytes=0 if working is None else working.outside_bytes,
            gradients_to_come_bytes=0 if working is None else working.gradients_to_come_bytes,
            autocast_past_forward=self._autocast_past_forward,
        )
        self._step = None
        self._recording = SaveSequence() if recording is not None else None  # next pass in the block
        self._restart_ordinals()
        self.timer.reset()
        return stats

    def abort_step(self) -> None:
        """Drop the step in progress: every swapped record is released and marked stale.

        Nothing another stream may still touch is dropped before the compute stream waited
        on the copy touching it.
        """
        self._stop_measuring(None)
        step, self._step = self._step, None
        if step is None:
            return
        step.aborted = True
        self._restart_ordinals()
        self._release_kept(step)
        self._release_devices(step)
        self._release_hosts(step.swapped)
        self._release_lingering()
        self.runtime.collect_wait_seconds()

    def close(self) -> None:
        """Abort any open step, free the idle host buffers and let go of the last model offloaded
        (a closed engine kept in a reference cycle must not keep the model's weights alive)."""
        self.abort_step()
        self.pool.trim()
        self._storages_model = None

    def _stop_measuring(self, step: StepState | None) -> WorkingMemory | None:
        """The working memory the pass measured at the levels of ``step``'s saving layers
        (``None``: the pass was aborted), ``None`` when it measured none; the ledger is no longer
        observed."""
        meter = self._meter
        if meter is None:
            return None
        self._meter = None
        if self._arrivals is not None:
            self._arrivals.close()
            self._arrivals = None
        ledger = self.ledger
        assert isinstance(ledger, ObservedLedger)
        self.ledger = ledger.unobserved()
        return None if step is None else meter.end(ledger.current_bytes, tuple(step.layer_saved))

    def _observed_peak(self, route: ReplayRoute) -> int | None:
        """The activation peak of the last observed pass, if it was replayed on ``route``
        without departing from its sequence (the passes of the route may then run unobserved);
        ``None`` otherwise."""
        last = self._last_observed
        return last[1] if last is not None and last[0] is route else None

    def _restart_ordinals(self) -> None:
        """The next save is the first of a pass: ordinal 0, on the sequence replayed (if any)."""
        self._calls, self._departed = 0, -1
        self._fast_end = len(self._route) if self._replaying is not None else 0


def _pointers_of(model: nn.Module) -> set[int]:
    """Data addresses of the model's parameters and buffers: a cheap first filter (a tensor
    starting there is one of them or a view of one at its start)."""
    tensors = [*model.parameters(), *model.buffers()]
    return {pointer for tensor in tensors if (pointer := tensor.data_ptr()) != 0}


def _storages_of(model: nn.Module) -> set[int]:
    """Storage addresses of the model's parameters and buffers (views of them share these)."""
    tensors = [*model.parameters(), *model.buffers()]
    return {tensor.untyped_storage().data_ptr() for tensor in tensors}
