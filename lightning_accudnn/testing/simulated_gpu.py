"""A GPU played by the CPU: deferred copy stream, stream-ordered allocator, happens-before checker.

The compute stream is the CPU itself (PyTorch runs CPU ops as they are issued). The copy
stream is a queue: each copy is really executed (its bytes really move) only when the CPU
observes it, ``lag`` runtime operations after it was issued (``None``: only when the compute
stream waits on it), so every decision the engine makes is exercised with the CPU running
ahead of the device. Each stream keeps a vector clock; an event holds the clock of its stream
at its last record and a wait merges the clock the event holds when the wait is issued (as
CUDA's events do), so each read, write and free is checked against the accesses of the other
stream it must follow.
Events are reused as :class:`~lightning_accudnn.ops.CudaRuntime` reuses them: one compute
event recorded again for each group of copies, and the copy stream's from an
:class:`~lightning_accudnn.ops.runtime.EventRing`; a wait on a mark whose event was recorded
again since for a later group is counted (``stale_waits``: it waits for more than it needs).
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable

import torch

from lightning_accudnn.ops.host_allocation import new_host_buffer
from lightning_accudnn.ops.runtime import CopyMark, EventRing, StallListener, StreamEvent
from lightning_accudnn.testing.allocator import StreamOrderedAllocator

_COMPUTE, _COPY = 0, 1
_POISON = 0xFF  # bytes: NaN in every floating type, -1 in signed integers


class _Event:
    """A reusable event: the clock of its stream at its last record, and the generation of the
    group of copies it marked then (0 for the compute event)."""

    __slots__ = ("clock", "marked")

    def __init__(self) -> None:
        self.clock = (0, 0)
        self.marked = 0

    def record(self, clock: list[int], marked: int = 0) -> None:
        self.clock = (clock[0], clock[1])
        self.marked = marked


class _Block:
    """A device block the engine holds: where it came from and the last copy-stream accesses."""

    __slots__ = (
        "key",
        "nbytes",
        "size",
        "holds",
        "ready_at",
        "last_copy_write",
        "last_copy_access",
    )

    def __init__(self, key: int, nbytes: int, size: int, ready_at: int) -> None:
        self.key = key
        self.nbytes = nbytes
        self.size = size
        self.holds = 1
        self.ready_at = ready_at  # compute position of its write (a saved storage) or allocation
        self.last_copy_write = 0
        self.last_copy_access = 0


class _CopyOp:
    __slots__ = ("position", "due", "run")

    def __init__(self, position: int, due: float, run: Callable[[], None]) -> None:
        self.position = position
        self.due = due
        self.run = run


class SimulatedGPU:
    """A :class:`~lightning_accudnn.ops.runtime.Runtime` on CPU tensors that behaves like a GPU.

    - Copy-stream work runs up to ``lag`` runtime operations after it was issued (``0``: at
      once; ``None``: only when the compute stream waits on it); with ``seed``, each copy's
      lag is drawn from ``0..lag``.
    - Host buffers are poisoned (every byte ``0xFF``) in copy-stream order when the engine's
      ownership ends; device blocks the engine allocates start poisoned (never-written bytes).
    - Every device block the engine holds (saved storages it registers, copies brought back)
      lives in a :class:`~lightning_accudnn.testing.StreamOrderedAllocator` capped at
      ``capacity_bytes``: ``peak_bytes`` (reserved, its peak), ``num_alloc_retries``,
      ``num_ooms``; past the cap allocation raises ``SimulatedOutOfMemory``.
    - ``violations`` lists every read not ordered after the write it needs and every free of
      a block the copy stream may still touch (empty when all is well).

    Example:
        >>> from torch import nn
        >>> from lightning_accudnn.ops import OffloadEngine, SwapSchedule
        >>> gpu = SimulatedGPU(lag=None)
        >>> engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0, runtime=gpu)
        >>> model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
        >>> with engine.offload(model, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        ...     loss = model(torch.randn(32, 64)).sum()
        >>> loss.backward()
        >>> stats = engine.end_step()
        >>> gpu.violations, gpu.num_ooms, engine.pool.in_use_bytes
        ([], 0, 0)
        >>> gpu.peak_bytes > 0
        True
    """

    device = torch.device("cpu")
    pin_memory = False
    tracks_blocks = True  # its allocator model needs every hold and release
    timing = False  # set by the engine for hooked passes: then each wait is a stall

    def __init__(
        self, lag: int | None = 0, seed: int | None = None, capacity_bytes: int | None = None
    ) -> None:
        if lag is not None and lag < 0:
            raise ValueError(f"lag must be >= 0 or None (unbounded), got {lag}")
        self.lag = lag
        self._rng = random.Random(seed) if seed is not None else None
        self.allocator = StreamOrderedAllocator(capacity_bytes)
        self.violations: list[str] = []
        self._clocks = [[0, 0], [0, 0]]  # per stream: what it has seen of (compute, copy)
        self._tick = 0  # runtime operations issued by the CPU
        self._queue: deque[_CopyOp] = deque()
        self._blocks: dict[int, _Block] = {}
        self._poisoned_hosts: set[int] = set()
        self._host_reads: dict[int, int] = {}  # host buffer -> the last copy in reading it
        self._host_writes: dict[int, int] = {}  # host buffer -> the last copy out writing it
        self._host_releases: dict[int, int] = {}  # host buffer -> its last release's copy op
        self.held_bytes = 0
        self.peak_held_bytes = 0
        self._written = _Event()  # the compute event, recorded again at each record_compute
        self.events: EventRing[_Event] = EventRing(_Event)  # the copy stream's, reused
        self.stale_waits = 0
        self.stalls: StallListener | None = None  # told the wall-clock marks around timed waits

    # -- figures ------------------------------------------------------------------------

    @property
    def peak_bytes(self) -> int:
        """The allocator's peak of reserved bytes (cached blocks included)."""
        return self.allocator.peak_reserved_bytes

    @property
    def num_alloc_retries(self) -> int:
        return self.allocator.num_alloc_retries

    @property
    def num_ooms(self) -> int:
        return self.allocator.num_ooms

    def reset_peaks(self) -> None:
        """Restart the peaks from what is held now (e.g. at the start of a step)."""
        self.peak_held_bytes = self.held_bytes
        self.allocator.peak_allocated_bytes = self.allocator.allocated_bytes
        self.allocator.peak_reserved_bytes = self.allocator.reserved_bytes

    def synchronize(self) -> None:
        """Run every copy still queued (the device catches up with the CPU)."""
        self._run_through(self._clocks[_COPY][_COPY])

    # -- streams --------------------------------------------------------------------------

    def _compute_op(self) -> int:
        self._tick += 1
        self._clocks[_COMPUTE][_COMPUTE] += 1
        self._run_due()
        return self._clocks[_COMPUTE][_COMPUTE]

    def _copy_waits(self, after: StreamEvent) -> None:
        assert isinstance(after, _Event), "a copy must be ordered after a compute event"
        clock = self._clocks[_COPY]  # the event's clock now: its last record
        clock[_COMPUTE] = max(clock[_COMPUTE], after.clock[_COMPUTE])

    def _enqueue(self, run: Callable[[], None]) -> int:
        self._tick += 1
        self._clocks[_COPY][_COPY] += 1
        position = self._clocks[_COPY][_COPY]
        lag: float
        if self.lag is None:
            lag = float("inf")
        else:
            lag = self._rng.randint(0, self.lag) if self._rng is not None else self.lag
        self._queue.append(_CopyOp(position, self._tick + lag, run))
        self._run_due()
        return position

    def _run_due(self) -> None:
        while self._queue and self._queue[0].due <= self._tick:
            self._queue.popleft().run()

    def _run_through(self, position: int) -> None:
        while self._queue and self._queue[0].position <= position:
            self._queue.popleft().run()

    def _ordered_copy(
        self, after: StreamEvent, device: torch.Tensor, *, missing: str, early: str
    ) -> _Block | None:
        """Order the copy stream after ``after``; report a copy of device memory the engine does
        not hold, or one not ordered after the compute op that wrote or allocated its block."""
        self._copy_waits(after)
        block = self._block_of(device)
        seen = self._clocks[_COPY][_COMPUTE]
        if block is None:
            self.violations.append(missing.format(address=f"{device.data_ptr():#x}"))
        elif block.ready_at > seen:
            self.violations.append(early.format(key=f"{block.key:#x}", ready=block.ready_at, seen=seen))
        return block

    def _block_of(self, tensor: torch.Tensor) -> _Block | None:
        return self._blocks.get(tensor.untyped_storage().data_ptr())

    # -- the runtime interface ------------------------------------------------------------

    def begin_pass(self) -> None:
        pass  # one compute stream: the CPU

    def record_compute(self) -> StreamEvent:
        self._compute_op()
        written = self._written
        written.record(self._clocks[_COMPUTE])
        return written

    def copy_out(
        self, after: StreamEvent, sources: list[torch.Tensor], hosts: list[torch.Tensor]
    ) -> StreamEvent:
        return self._group(self._copy_out, after, sources, hosts)

    def _group(
        self,
        copy: Callable[[StreamEvent, torch.Tensor, torch.Tensor], None],
        after: StreamEvent,
        froms: list[torch.Tensor],
        tos: list[torch.Tensor],
    ) -> StreamEvent:
        """A group of copies: each checked and queued as its own copy-stream op, one event after all."""
        for source, destination in zip(froms, tos, strict=True):
            copy(after, source, destination)
        done = self.events.take()
        done.event.record(self._clocks[_COPY], done.generation)
        return done

    def _copy_out(self, after: StreamEvent, source: torch.Tensor, host: torch.Tensor) -> None:
        block = self._ordered_copy(
            after,
            source,
            missing="copy out of device memory at {address} that the engine does not hold",
            early="copy out of block {key} is not ordered after its write (compute op {ready}; "
            "the copy stream has seen compute op {seen})",
        )
        host_key = host.data_ptr()

        def run() -> None:
            with torch.no_grad():  # a copy on a stream, whatever grad mode the CPU is in when it lands
                host.copy_(source)
            self._poisoned_hosts.discard(host_key)

        position = self._enqueue(run)
        self._host_writes[host_key] = position
        if block is not None:
            block.last_copy_access = position

    def copy_out_now(self, sources: list[torch.Tensor], hosts: list[torch.Tensor]) -> None:
        """On the compute stream, at once, when no group of copies is pending (as
        :class:`~lightning_accudnn.ops.CudaRuntime` does), else a group on the copy stream compute
        waits on. Writing a host buffer a copy in may still read is a violation; the release of a
        buffer written here lands first (the copy stream ran it early)."""
        self._copies_now(self._copy_out, self._copy_out_in_order, sources, hosts)

    def copy_in_now(self, hosts: list[torch.Tensor], dests: list[torch.Tensor]) -> None:
        """As :meth:`copy_out_now`, into blocks the engine allocated: reading a host buffer whose
        copy out compute is not ordered after, or one the engine released, is a violation."""
        self._copies_now(self._copy_in, self._copy_in_in_order, hosts, dests)

    def _copies_now(
        self,
        on_copy_stream: Callable[[StreamEvent, torch.Tensor, torch.Tensor], None],
        in_order: Callable[[torch.Tensor, torch.Tensor, int], None],
        froms: list[torch.Tensor],
        tos: list[torch.Tensor],
    ) -> None:
        """A group compute would wait on at once: a group on the copy stream (each copy by
        ``on_copy_stream``) that compute waits on when one is pending, else each pair copied now,
        in compute order, by ``in_order`` (given the copy op compute has seen)."""
        if self._pending_group():
            self.wait(self._group(on_copy_stream, self.record_compute(), froms, tos))
            return
        self._compute_op()
        seen = self._clocks[_COMPUTE][_COPY]
        before = time.perf_counter()
        for source, destination in zip(froms, tos, strict=True):
            in_order(source, destination, seen)
        self._stalled(before)

    def _copy_out_in_order(self, source: torch.Tensor, host: torch.Tensor, seen: int) -> None:
        if self._block_of(source) is None:
            self.violations.append(
                f"copy out of device memory at {source.data_ptr():#x} that the engine does not hold"
            )
        host_key = host.data_ptr()
        read = self._host_reads.get(host_key, 0)
        if read > seen:
            self.violations.append(
                f"copy out on the compute stream writes host buffer {host_key:#x} that a copy in "
                f"(copy op {read}) may still read (compute has seen copy op {seen})"
            )
        self._run_through(self._host_releases.pop(host_key, 0))
        with torch.no_grad():
            host.copy_(source)
        self._poisoned_hosts.discard(host_key)
        self._host_writes[host_key] = 0

    def _copy_in_in_order(self, host: torch.Tensor, dest: torch.Tensor, seen: int) -> None:
        if self._block_of(dest) is None:
            self.violations.append(
                f"copy in to device memory at {dest.data_ptr():#x} the engine does not hold"
            )
        host_key = host.data_ptr()
        written = self._host_writes.get(host_key, 0)
        if written > seen:
            self.violations.append(
                f"copy in on the compute stream reads host buffer {host_key:#x} before the copy "
                f"out writing it (copy op {written}) is ordered before it (compute has seen {seen})"
            )
        if host_key in self._poisoned_hosts:
            self.violations.append(f"copy in read host buffer {host_key:#x} after the engine had released it")
        with torch.no_grad():
            dest.copy_(host)

    def _pending_group(self) -> bool:
        """Whether compute is not ordered after every group of copies issued so far."""
        events = self.events
        return events.waited_generation != events.generation

    def _stalled(self, before: float) -> None:
        """Copies in compute order ran from ``before`` until now: a stall while timing."""
        if self.timing and self.stalls is not None:
            self.stalls.stall(before, time.perf_counter())

    def allocate(self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        position = self._compute_op()
        nbytes = math.prod(shape) * dtype.itemsize
        size = self.allocator.malloc("compute", nbytes)
        tensor = torch.full((nbytes,), _POISON, dtype=torch.uint8).view(dtype).as_strided(shape, stride)
        self._add_block(_Block(tensor.untyped_storage().data_ptr(), nbytes, size, position))
        return tensor

    def allocate_host(self, nbytes: int) -> torch.Tensor:
        """A host buffer (plain memory here: nothing of the simulated device's), its allocation
        a stall while timing, as pinning on a GPU's host is."""
        start = time.perf_counter()
        buffer = new_host_buffer(nbytes, pin_memory=False)
        self._stalled(start)
        return buffer

    def copy_in(
        self, after: StreamEvent, hosts: list[torch.Tensor], dests: list[torch.Tensor]
    ) -> StreamEvent:
        return self._group(self._copy_in, after, hosts, dests)

    def _copy_in(self, after: StreamEvent, host: torch.Tensor, dest: torch.Tensor) -> None:
        block = self._ordered_copy(
            after,
            dest,
            missing="copy in to device memory at {address} the engine does not hold",
            early="copy in writes block {key} before its allocation on the compute stream is ordered "
            "before it (compute op {ready}; the copy stream has seen {seen})",
        )
        host_key = host.data_ptr()

        def run() -> None:
            if host_key in self._poisoned_hosts:
                self.violations.append(
                    f"copy in read host buffer {host_key:#x} after the engine had released it"
                )
            with torch.no_grad():
                dest.copy_(host)

        position = self._enqueue(run)
        self._host_reads[host_key] = position
        if block is not None:
            block.last_copy_write = block.last_copy_access = position

    def wait(self, event: StreamEvent) -> None:
        assert isinstance(event, CopyMark), "compute waits on a group of copies"
        events = self.events
        if not events.pending(event):  # compute waited on a later group: ordered after this one
            return
        self._compute_op()
        recorded = event.event
        assert isinstance(recorded, _Event)
        if recorded.marked != event.generation:
            self.stale_waits += 1
        clock = self._clocks[_COMPUTE]
        clock[_COPY] = max(clock[_COPY], recorded.clock[_COPY])
        clock[_COMPUTE] = max(clock[_COMPUTE], recorded.clock[_COMPUTE])
        before = time.perf_counter()
        self._run_through(recorded.clock[_COPY])  # the copies compute waits for run now
        self._stalled(before)
        events.waited(event)

    def use_on_compute(self, data: torch.Tensor, ready: StreamEvent | None) -> None:
        if ready is not None and self.events.pending(ready):  # type: ignore[arg-type]
            self.wait(ready)
        else:
            self._compute_op()
        block = self._block_of(data)
        seen = self._clocks[_COMPUTE][_COPY]
        if block is not None and block.last_copy_write > seen:
            self.violations.append(
                f"compute reads block {block.key:#x} before the copy writing it (copy op "
                f"{block.last_copy_write}) is ordered before the read (compute has seen copy op {seen})"
            )

    def hold(self, key: int, nbytes: int) -> None:
        position = self._compute_op()
        block = self._blocks.get(key)
        if block is not None:
            block.holds += 1
            return
        size = self.allocator.malloc("compute", nbytes)
        self._add_block(_Block(key, nbytes, size, position))

    def release(self, key: int) -> None:
        self._compute_op()
        block = self._blocks.get(key)
        if block is None:
            self.violations.append(f"release of block {key:#x} that is not held")
            return
        block.holds -= 1
        if block.holds > 0:
            return
        seen = self._clocks[_COMPUTE][_COPY]
        if block.last_copy_access > seen:
            self.violations.append(
                f"block {key:#x} freed on the compute stream while the copy stream may still touch it "
                f"(copy op {block.last_copy_access}; compute has seen copy op {seen})"
            )
        del self._blocks[key]
        self.held_bytes -= block.nbytes
        self.allocator.free("compute", block.size)

    def release_host(self, host: torch.Tensor) -> None:
        host_key = host.data_ptr()

        def run() -> None:
            host.fill_(_POISON)
            self._poisoned_hosts.add(host_key)

        self._host_releases[host_key] = self._enqueue(run)

    def collect_wait_seconds(self) -> float:
        return 0.0

    def _add_block(self, block: _Block) -> None:
        self._blocks[block.key] = block
        self.held_bytes += block.nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
