"""The device operations the engine needs, in GPU (stream) order, behind one small interface.

Two streams: *compute* (where the model runs and where the CPU's work lands) and *copy*
(device-to-host and host-to-device copies). The engine only ever:

- records an event on compute (:meth:`Runtime.record_compute`),
- copies a group of tensors out or in on the copy stream after such an event
  (:meth:`~Runtime.copy_out`, :meth:`~Runtime.copy_in`), each call returning one event for
  its group (a layer's storages, a prefetch round: not one event per tensor),
- allocates on the compute stream (:meth:`~Runtime.allocate`, typed like the copy it receives),
- makes compute wait on an event (:meth:`~Runtime.wait`, :meth:`~Runtime.use_on_compute`),
- tells the runtime which device blocks it holds and when it drops them
  (:meth:`~Runtime.hold`, :meth:`~Runtime.release`; on CUDA dropping the reference *is*
  the release, in compute-stream order) and when a host buffer leaves its ownership
  (:meth:`~Runtime.release_host`).

No operation here makes the CPU wait for the device. Implementations: :class:`CudaRuntime`
(the only code touching ``torch.cuda`` streams), :class:`HostCopyRuntime` (synchronous copies
on CPU), and ``lightning_accudnn.testing.SimulatedGPU`` (CPU, deferred copy stream, allocator
model and happens-before checker).
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from lightning_accudnn.ops._torch_internals import CurrentCudaStream, copy_each

StreamEvent = object
"""An opaque point in a stream's order, made by a runtime and only given back to it."""


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

    def record_compute(self) -> StreamEvent:
        """An event after the compute work issued so far."""
        ...

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        """Copy each device tensor of ``sources`` into the host tensor of ``hosts`` at the same
        index, on the copy stream, ordered after ``after``; one event after them all."""
        ...

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A device tensor of ``shape``, ``stride`` (dense: no gaps, no overlap) and ``dtype``,
        allocated on the compute stream (contents undefined)."""
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

    def record_compute(self) -> StreamEvent:
        return None

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        start = time.perf_counter()
        copy_each(hosts, sources, non_blocking=False)
        self._waited += time.perf_counter() - start
        return None

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, stride, dtype=dtype)

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        start = time.perf_counter()
        copy_each(dests, hosts, non_blocking=False)
        self._waited += time.perf_counter() - start
        return None

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

    Example:
        >>> runtime = CudaRuntime(torch.device("cuda", 0))  # doctest: +SKIP
    """

    pin_memory = True
    tracks_blocks = False  # dropping the reference is the release, in compute-stream order

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._compute = CurrentCudaStream(self._index)  # the compute stream: current at each call
        self.copy_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.timing = True
        self._probes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._last_probes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def record_compute(self) -> StreamEvent:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self._compute.get())
        return event

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        return self._copies(after, hosts, sources)

    def _copies(
        self, after: StreamEvent, dests: list[torch.Tensor], sources: list[torch.Tensor]
    ) -> StreamEvent:
        """A group of copies on the copy stream after ``after``: one wait, one call, one event.

        The copy stream is made current around the call, as ``torch.cuda.stream`` would, and
        the stream current before is made current again; that context itself (it looks the
        current stream up twice and compares devices) serves only when another device is
        current."""
        assert isinstance(after, torch.cuda.Event)
        copy = self.copy_stream
        after.wait(copy)
        if torch.cuda.current_device() != self._index:
            with torch.cuda.stream(copy):
                return self._issue(copy, dests, sources)
        previous = self._compute.get()
        torch.cuda.set_stream(copy)
        try:
            return self._issue(copy, dests, sources)
        finally:
            torch.cuda.set_stream(previous)

    @staticmethod
    def _issue(
        copy: torch.cuda.Stream, dests: list[torch.Tensor], sources: list[torch.Tensor]
    ) -> StreamEvent:
        copy_each(dests, sources, non_blocking=True)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(copy)
        return done

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(shape, stride, dtype=dtype, device=self.device)

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        return self._copies(after, dests, hosts)

    def wait(self, event: StreamEvent) -> None:
        assert isinstance(event, torch.cuda.Event)
        event.wait(self._compute.get())

    def use_on_compute(self, data: torch.Tensor, ready: StreamEvent | None) -> None:
        if ready is None:
            return
        assert isinstance(ready, torch.cuda.Event)
        compute = self._compute.get()
        if not self.timing:
            ready.wait(compute)
            return
        before = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        after = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        before.record(compute)
        ready.wait(compute)
        after.record(compute)
        self._probes.append((before, after))

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
