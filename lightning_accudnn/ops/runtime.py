"""The device operations the engine needs, in GPU (stream) order, behind one small interface.

Two streams: *compute* (where the model runs and where the CPU's work lands) and *copy*
(device-to-host and host-to-device copies). The engine only ever:

- starts each pass (forward or backward) with :meth:`Runtime.begin_pass`: the stream current
  then is the compute stream until the next call,
- records an event on compute (:meth:`Runtime.record_compute`) and gives it at once to a copy,
- copies a group of tensors out or in on the copy stream after such an event
  (:meth:`~Runtime.copy_out`, :meth:`~Runtime.copy_in`), each call returning one event for
  its group (a layer's storages, a prefetch round: not one event per tensor),
- copies a group that compute would wait on at once (:meth:`~Runtime.copy_out_now`: the
  copy-out limit needs its sources gone now; :meth:`~Runtime.copy_in_now`: a save is read now)
  with compute ordered after it on return: on the compute stream itself when no group on the
  copy stream is pending (then no event, wait or stream switch at all), else on the copy stream
  with compute waiting on it,
- allocates on the compute stream (:meth:`~Runtime.allocate`, typed like the copy it receives),
- makes compute wait on an event (:meth:`~Runtime.wait`, :meth:`~Runtime.use_on_compute`),
- tells the runtime which device blocks it holds and when it drops them
  (:meth:`~Runtime.hold`, :meth:`~Runtime.release`; on CUDA dropping the reference *is*
  the release, in compute-stream order) and when a host buffer leaves its ownership
  (:meth:`~Runtime.release_host`).

Events are reused: the compute event of :meth:`~Runtime.record_compute` is valid until the next
call, and a group's event on the copy stream is a :class:`CopyMark` (the event and the group's
generation), whose event goes back to its :class:`EventRing` once compute is ordered after that
generation; a wait on a mark compute is already ordered after costs nothing.

While :attr:`Runtime.timing` is set, every wait of compute on copies is bracketed by two marks of
the layer timer's clock, given to :attr:`Runtime.stalls`: that time is compute *waiting*, not a
layer's compute, and the performance model must not learn it as compute (a profiling pass that
swaps much would otherwise measure the link's time as the layers' and plan to hide copies behind
compute that is not there).

No operation here makes the CPU wait for the device. Implementations: :class:`CudaRuntime`
(the only code touching ``torch.cuda`` streams), :class:`HostCopyRuntime` (synchronous copies
on CPU), and ``lightning_accudnn.testing.SimulatedGPU`` (CPU, deferred copy stream, allocator
model and happens-before checker).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

import torch

from lightning_accudnn.ops._torch_internals import CurrentCudaStream, copy_each
from lightning_accudnn.ops.host_allocation import new_host_buffer

StreamEvent = object
"""An opaque point in a stream's order, made by a runtime and only given back to it."""


class StallListener(Protocol):
    """Told of each timed wait of compute on copies: the clock's marks just before and after it."""

    def stall(self, before: Any, after: Any) -> None: ...


Event = TypeVar("Event")
_Result = TypeVar("_Result")


class CopyMark(Generic[Event]):
    """A point in the copy stream's order: the event recorded there and its generation (how many
    groups of copies were issued up to and with it). The event itself is reused for a later
    group once compute is ordered after this generation (:meth:`EventRing.waited`), and a wait
    on the mark is then skipped, so that the event is never waited on for a group it no longer
    marks.

    Example:
        >>> CopyMark(3, "event").generation
        3
    """

    __slots__ = ("generation", "event")

    def __init__(self, generation: int, event: Event) -> None:
        self.generation = generation
        self.event = event


class EventRing(Generic[Event]):
    """The copy stream's events, reused: one per group of copies in flight, none made per step
    in the steady state.

    :meth:`take` gives the next group its mark, with an event back from the pool or made by
    ``make``; :meth:`pending` says whether compute still has to wait on a mark (its generation is
    after the last one compute waited on: the copy stream runs its groups in order, so a wait on
    a later group orders compute after every earlier one); :meth:`waited` notes a wait, and the
    events of that mark and of every earlier one go back to the pool. A mark never waited on
    keeps its event; past ``cap`` marks in flight the oldest leave the ring without going back to
    the pool (their events die with their marks): a wait on them is still right, and the ring
    stays bounded whatever the caller forgets.

    Example:
        >>> ring = EventRing(object)
        >>> first, second = ring.take(), ring.take()
        >>> ring.pending(first), ring.created
        (True, 2)
        >>> ring.waited(second)
        >>> ring.pending(first), ring.pending(second)
        (False, False)
        >>> third = ring.take()
        >>> ring.created, third.generation, third.event in (first.event, second.event)
        (2, 3, True)
    """

    __slots__ = ("_make", "_free", "_in_flight", "_cap", "generation", "waited_generation", "created")

    def __init__(self, make: Callable[[], Event], cap: int = 1024) -> None:
        self._make = make
        self._free: list[Event] = []
        self._in_flight: deque[CopyMark[Event]] = deque()  # oldest first
        self._cap = cap
        self.generation = 0  # of the last mark taken
        self.waited_generation = 0  # compute is ordered after every mark up to this one
        self.created = 0  # events made

    def take(self) -> CopyMark[Event]:
        """The mark of the next group of copies (its event is to be recorded after them)."""
        free = self._free
        if free:
            event = free.pop()
        else:
            event = self._make()
            self.created += 1
        self.generation = generation = self.generation + 1
        mark = CopyMark(generation, event)
        in_flight = self._in_flight
        in_flight.append(mark)
        if len(in_flight) > self._cap:
            in_flight.popleft()
        return mark

    def pending(self, mark: CopyMark[Event]) -> bool:
        """Whether compute is not yet ordered after ``mark``."""
        return mark.generation > self.waited_generation

    def waited(self, mark: CopyMark[Event]) -> None:
        """Compute now waits on ``mark``: its event and those of earlier marks may be reused."""
        generation = mark.generation
        if generation <= self.waited_generation:
            return
        self.waited_generation = generation
        in_flight, free = self._in_flight, self._free
        while in_flight and in_flight[0].generation <= generation:
            free.append(in_flight.popleft().event)

    def forget_waits(self) -> None:
        """Compute is now another stream, ordered after none of the marks: every mark is pending
        again (a wait on one whose event was reused since waits on a later group: more than
        needed, never less, as the copy stream runs its groups in order)."""
        self.waited_generation = 0


class Runtime(Protocol):
    """What the engine needs from a device (see the module docstring for the order rules)."""

    device: torch.device
    pin_memory: bool
    tracks_blocks: bool
    """Whether :meth:`hold` and :meth:`release` do anything (a model of the device's allocator):
    when not, the engine's fast path for kept saves skips them and never reads an address."""
    timing: bool
    """Whether waits on copies are timed now: the engine sets it for hooked (profiling and
    refining) passes only, so that a steady-state step records no timing events."""
    stalls: StallListener | None
    """Told the marks around each wait of compute on copies while :attr:`timing` is set (the
    engine's layer timer, so that no layer's compute time holds a wait)."""

    def begin_pass(self) -> None:
        """A forward or backward pass starts: the stream current now is its compute stream."""
        ...

    def record_compute(self) -> StreamEvent:
        """An event after the compute work issued so far, for the copy that follows at once (the
        runtime may record the same event again at its next call)."""
        ...

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        """Copy each device tensor of ``sources`` into the host tensor of ``hosts`` at the same
        index, on the copy stream, ordered after ``after``; one event after them all."""
        ...

    def copy_out_now(self, sources: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
        """Copy as :meth:`copy_out` does, with the compute work issued from now on ordered after
        the copies (nothing to wait on). Copying on the compute stream is safe only when every
        copy on the copy stream that may read one of ``hosts`` (a buffer's earlier owner's copy
        in) is ordered before compute: a runtime copies there only when no group of copies is
        pending, else it copies on the copy stream and makes compute wait. While :attr:`timing`
        is set, the copies' time is a stall, as a wait on them would be."""
        ...

    def copy_in_now(self, hosts: list[torch.Tensor], dests: list[torch.Tensor]) -> None:
        """Copy as :meth:`copy_in` does (``dests`` allocated on the compute stream, the copies
        out that wrote ``hosts`` waited on), with the compute work issued from now on ordered
        after the copies, as :meth:`copy_out_now`."""
        ...

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A device tensor of ``shape``, ``stride`` (dense: no gaps, no overlap) and ``dtype``,
        allocated on the compute stream (contents undefined)."""
        ...

    def allocate_host(self, nbytes: int) -> torch.Tensor:
        """A new host buffer of ``nbytes`` (``uint8``), pinned when :attr:`pin_memory` is set.
        Pinning holds the host for milliseconds a call, while compute may run dry: while
        :attr:`timing` is set, the call is bracketed by two marks given to :attr:`stalls`, as a
        wait on copies is (no layer's compute)."""
        ...

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        """Copy each host tensor of ``hosts`` into the device tensor of ``dests`` at the same
        index, on the copy stream, ordered after ``after``; one event after them all."""
        ...

    def wait(self, event: StreamEvent) -> None:
        """Order the compute work issued from now on after ``event`` (the CPU does not wait)."""
        ...

    def use_on_compute(self, data: torch.Tensor, ready: StreamEvent | None) -> None:
        """Compute is about to read ``data``: wait on ``ready`` first when given."""
        ...

    def hold(self, key: int, nbytes: int) -> None:
        """The engine now holds device block ``key`` (a saved storage's address) of ``nbytes``."""
        ...

    def release(self, key: int) -> None:
        """The engine drops its last reference to block ``key`` now, in compute-stream order."""
        ...

    def release_host(self, host: torch.Tensor) -> None:
        """The engine's ownership of host buffer ``host`` ends (it goes back to the pool)."""
        ...

    def collect_wait_seconds(self) -> float:
        """Seconds compute waited on copies, measured since the last call (may lag a step)."""
        ...


class HostCopyRuntime:
    """Synchronous copies between CPU tensors; the "device" is the CPU itself.

    No memory is saved this way: it exists so that the engine, the plan and the budget
    arithmetic run for real on machines without a GPU. The compute "stream" is the calling
    thread, so every copy counts as time the compute waited.

    Example:
        >>> runtime = HostCopyRuntime()
        >>> source = torch.arange(8, dtype=torch.uint8)
        >>> host = torch.empty(8, dtype=torch.uint8)
        >>> _ = runtime.copy_out(runtime.record_compute(), [source], [host])
        >>> back = runtime.allocate((8,), (1,), torch.uint8)
        >>> _ = runtime.copy_in(runtime.record_compute(), [host], [back])
        >>> bool(torch.equal(back, source))
        True
    """

    device = torch.device("cpu")
    pin_memory = False
    tracks_blocks = False

    def __init__(self) -> None:
        self._waited = 0.0
        self.timing = True  # copies are timed with the CPU's clock either way (no events)
        self.stalls: StallListener | None = None

    def begin_pass(self) -> None:
        pass

    def record_compute(self) -> StreamEvent:
        return None

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        start = time.perf_counter()
        copy_each(hosts, sources, non_blocking=False)
        self._copied(start)
        return None

    def copy_out_now(self, sources: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
        self.copy_out(None, sources, hosts)

    def copy_in_now(self, hosts: list[torch.Tensor], dests: list[torch.Tensor]) -> None:
        self.copy_in(None, hosts, dests)

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, stride, dtype=dtype)

    def allocate_host(self, nbytes: int) -> torch.Tensor:
        stalls = self.stalls if self.timing else None
        start = time.perf_counter()
        buffer = new_host_buffer(nbytes, pin_memory=False)
        if stalls is not None:
            stalls.stall(start, time.perf_counter())
        return buffer

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        start = time.perf_counter()
        copy_each(dests, hosts, non_blocking=False)
        self._copied(start)
        return None

    def _copied(self, start: float) -> None:
        """A synchronous copy began at ``start`` and is over: compute waited all that time."""
        end = time.perf_counter()
        self._waited += end - start
        if self.timing and self.stalls is not None:
            self.stalls.stall(start, end)

    def wait(self, event: StreamEvent) -> None:
        pass

    def use_on_compute(self, data: torch.Tensor, ready: StreamEvent | None) -> None:
        pass

    def hold(self, key: int, nbytes: int) -> None:
        pass

    def release(self, key: int) -> None:
        pass

    def release_host(self, host: torch.Tensor) -> None:
        pass

    def collect_wait_seconds(self) -> float:
        waited, self._waited = self._waited, 0.0
        return waited


class CudaRuntime:
    """A dedicated CUDA copy stream ordered against the compute stream by events.

    Device memory stays in the compute stream's pool: prefetch destinations are allocated on
    the compute stream and the copy stream waits on a compute event recorded after the
    allocation; a block the copy stream read or wrote is dropped only after compute waited on
    the copy's event (the engine's job), so no ``record_stream`` is needed. Waits on copies
    in are timed with two events around ``wait_event``, read one collection late so that the
    CPU never waits for the device. Only while :attr:`timing` is set (hooked passes): in
    steady state a copy in read costs one ``wait_event`` and nothing is read back.

    What a group of copies costs the host: one record of the compute event (one event, reused),
    one wait of the copy stream on it, the copy stream made current and the compute stream made
    current again, one record of the group's event (from an :class:`EventRing`: no event made in
    the steady state); and compute's wait on it, skipped when compute already waited on a later
    group. A group compute would wait on at once (:meth:`copy_out_now`, :meth:`copy_in_now`)
    costs none of these when no group is pending: it is copied on the compute stream itself.
    The compute stream is looked up once per pass (:meth:`begin_pass`), and so is the
    current device: copies issued in a pass that started on another device go through
    ``torch.cuda.stream``, which puts the device back too. Work of one pass is therefore on one
    compute stream: the stream current when the pass began (autograd runs a backward op on the
    stream its forward op ran on).

    Example:
        >>> runtime = CudaRuntime(torch.device("cuda", 0))  # doctest: +SKIP
    """

    pin_memory = True
    tracks_blocks = False  # dropping the reference is the release, in compute-stream order

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._current = CurrentCudaStream(self._index)
        self._compute: torch.cuda.Stream | None = None  # of the pass (None: the current one at each call)
        self._same_device = True  # the pass began on this runtime's device
        self.copy_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._written = torch.cuda.Event()  # type: ignore[no-untyped-call]  # on compute, recorded again
        self.events: EventRing[torch.cuda.Event] = EventRing(torch.cuda.Event)
        self.timing = True
        self.stalls: StallListener | None = None
        self._probes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._last_probes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def begin_pass(self) -> None:
        compute = self._current.get()
        if self._compute is not None and compute is not self._compute:
            self.events.forget_waits()  # waits on the stream before order nothing on this one
        self._compute = compute
        self._same_device = torch.cuda.current_device() == self._index

    def _compute_stream(self) -> torch.cuda.Stream:
        compute = self._compute
        return self._current.get() if compute is None else compute

    def record_compute(self) -> StreamEvent:
        written = self._written
        written.record(self._compute_stream())
        return written

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        return self._copies(after, hosts, sources)

    def _copies(
        self, after: StreamEvent, dests: list[torch.Tensor], sources: list[torch.Tensor]
    ) -> StreamEvent:
        """A group of copies on the copy stream after ``after``: one wait, one call, one event.

        The copy stream is made current around the call, as ``torch.cuda.stream`` would, and
        the compute stream is made current again; that context itself (it looks the current
        stream up twice and compares devices) serves only when the pass began on another
        device."""
        assert isinstance(after, torch.cuda.Event)
        copy = self.copy_stream
        after.wait(copy)
        done = self.events.take()
        compute = self._compute
        if compute is None:  # outside a pass: the current stream and device now
            compute = self._current.get()
            same_device = torch.cuda.current_device() == self._index
        else:
            same_device = self._same_device
        if not same_device:
            with torch.cuda.stream(copy):
                copy_each(dests, sources, non_blocking=True)
        else:
            torch.cuda.set_stream(copy)
            try:
                copy_each(dests, sources, non_blocking=True)
            finally:
                torch.cuda.set_stream(compute)
        done.event.record(copy)
        return done

    def copy_out_now(self, sources: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
        self._copies_now(hosts, sources)

    def copy_in_now(self, hosts: list[torch.Tensor], dests: list[torch.Tensor]) -> None:
        self._copies_now(dests, hosts)

    def _copies_now(self, dests: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        """On the compute stream when no group is pending on the copy stream (no call to
        ``torch.cuda`` in the steady state), else a group on the copy stream compute waits on.

        A copy on a device's tensors runs on that device's current stream, which is the pass's
        compute stream (:meth:`begin_pass`), whichever device is current."""
        events = self.events
        if events.waited_generation != events.generation:  # a copy may still use a host buffer
            self.wait(self._copies(self.record_compute(), dests, sources))
        elif self.timing:
            self._stall(partial(copy_each, dests, sources, non_blocking=True))
        else:
            copy_each(dests, sources, non_blocking=True)

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, stride, dtype=dtype, device=self.device)

    def allocate_host(self, nbytes: int) -> torch.Tensor:
        allocate = partial(new_host_buffer, nbytes, pin_memory=self.pin_memory)
        stalls = self.stalls if self.timing else None
        if stalls is None:
            return allocate()
        buffer, before, after = self._marked(allocate)
        stalls.stall(before, after)
        return buffer

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        return self._copies(after, dests, hosts)

    def wait(self, event: StreamEvent) -> None:
        assert isinstance(event, CopyMark)
        events = self.events
        if event.generation > events.waited_generation:  # EventRing.pending, inline
            if self.timing:
                self._timed_wait(event.event)
            else:
                event.event.wait(self._compute_stream())
            events.waited(event)

    def use_on_compute(self, data: torch.Tensor, ready: StreamEvent | None) -> None:
        if ready is not None:
            self.wait(ready)  # nothing when compute waited on a later group

    def _timed_wait(self, event: torch.cuda.Event) -> None:
        """Compute waits on ``event`` between two timing events (:meth:`_stall`)."""
        self._stall(partial(event.wait, self._compute_stream()))

    def _stall(self, work: Callable[[], object]) -> None:
        """Issue ``work`` on compute between two timing events, read one collection late and
        given to :attr:`stalls`: compute waiting, not a layer's compute."""
        _, before, after = self._marked(work)
        self._probes.append((before, after))
        if self.stalls is not None:
            self.stalls.stall(before, after)

    def _marked(self, work: Callable[[], _Result]) -> tuple[_Result, torch.cuda.Event, torch.cuda.Event]:
        """``work``'s result, and timing events on compute recorded just before and after it."""
        compute = self._compute_stream()
        before = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        after = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        before.record(compute)
        result = work()
        after.record(compute)
        return result, before, after

    def hold(self, key: int, nbytes: int) -> None:
        pass

    def release(self, key: int) -> None:
        pass

    def release_host(self, host: torch.Tensor) -> None:
        pass

    def collect_wait_seconds(self) -> float:
        """The waits of the collection before this one (long finished by now on a healthy step)."""
        waited = 0.0
        for before, after in self._last_probes:
            after.synchronize()
            waited += before.elapsed_time(after) / 1000.0
        self._last_probes, self._probes = self._probes, []
        return waited


def make_runtime(device: torch.device) -> HostCopyRuntime | CudaRuntime:
    """The runtime for ``device``: CUDA streams on a GPU, host copies on CPU.

    Example:
        >>> type(make_runtime(torch.device("cpu"))).__name__
        'HostCopyRuntime'
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return CudaRuntime(torch.device("cuda", index))
    if device.type == "cpu":
        return HostCopyRuntime()
    raise ValueError(f"lightning-accudnn swaps activations on CUDA or CPU devices, not {device.type!r}")
