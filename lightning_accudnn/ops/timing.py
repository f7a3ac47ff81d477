"""Per-layer compute time: marks at every layer boundary, read once the step is over.

On CUDA a mark is an event recorded on the compute stream (GPU time, no synchronization
until the step ends); on CPU it is the wall clock. Each interval between two marks belongs
to the layer on top of the stack then, so a layer's *self* time excludes its children and
the self times add up to the whole forward pass, less the stalls: the runtime brackets each
wait of compute on copies with two marks (:meth:`LayerTimer.stall`), and that time is left out
of the layers' forward times and of the backward's, which are *compute* times for the
performance model (the link's time it models apart).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ParamSpec, Protocol, TypeVar

import torch

from lightning_accudnn.ops.runtime import StallListener
from lightning_accudnn.profile import ROOT_LAYER

_Arguments = ParamSpec("_Arguments")
_Result = TypeVar("_Result")


class Clock(Protocol):
    def mark(self) -> Any: ...

    def seconds_between(self, start: Any, end: Any) -> float: ...

    def ready(self, mark: Any) -> bool: ...


class WallClock:
    """Marks are ``time.perf_counter()`` readings.

    Example:
        >>> clock = WallClock()
        >>> start = clock.mark()
        >>> clock.seconds_between(start, clock.mark()) >= 0
        True
    """

    def mark(self) -> float:
        return time.perf_counter()

    def seconds_between(self, start: float, end: float) -> float:
        return end - start

    def ready(self, mark: float) -> bool:
        return True


class CudaEventClock:
    """Marks are timing events on the current CUDA stream; reading one waits for it.

    Example:
        >>> clock = CudaEventClock()  # doctest: +SKIP
        >>> start = clock.mark(); end = clock.mark()  # doctest: +SKIP
        >>> clock.seconds_between(start, end)  # doctest: +SKIP
    """

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def seconds_between(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0

    def ready(self, mark: torch.cuda.Event) -> bool:
        """Whether the device reached the mark (reading it then does not wait)."""
        return bool(mark.query())  # type: ignore[no-untyped-call]


def clock_for(device: torch.device) -> Clock:
    return CudaEventClock() if device.type == "cuda" else WallClock()


class LayerTimer:
    """Self time of each layer invocation in a forward pass, and the backward that follows.

    Example:
        >>> timer = LayerTimer(WallClock())
        >>> timer.start()
        >>> timer.enter("conv"); timer.exit("conv")
        >>> timer.end_forward(); timer.end_backward()
        >>> sorted(timer.forward_self_seconds())
        ['(root)', 'conv']
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._stack: list[str] = []
        self._intervals: list[tuple[str, object, object]] = []
        self._last: object = None
        self._forward_end: object = None
        self._backward_end: object = None
        self._backward_stalls: list[tuple[object, object]] = []

    def start(self) -> None:
        self._stack = [ROOT_LAYER]
        self._intervals = []
        self._backward_stalls = []
        self._last = self.clock.mark()
        self._start = self._last
        self._forward_end = self._backward_end = None

    def reset(self) -> None:
        """Forget the step; marks stop until the next :meth:`start`."""
        self._stack = []

    @property
    def started(self) -> bool:
        return bool(self._stack)

    def _close_interval(self) -> None:
        now = self.clock.mark()
        self._intervals.append((self._stack[-1], self._last, now))
        self._last = now

    def enter(self, layer: str) -> None:
        if self.started:
            self._close_interval()
            self._stack.append(layer)

    def exit(self, layer: str) -> None:
        if self.started and len(self._stack) > 1:
            self._close_interval()
            self._stack.pop()

    def stall(self, before: object, after: object) -> None:
        """Compute waited on copies between the marks ``before`` and ``after`` (taken on the
        compute stream by the runtime): that time is no layer's, in forward or in backward.

        Example:
            >>> timer = LayerTimer(WallClock())
            >>> timer.start(); timer.enter("conv")
            >>> before = timer.clock.mark(); time.sleep(0.05); after = timer.clock.mark()
            >>> timer.stall(before, after)  # compute waited 50 ms on a copy inside "conv"
            >>> timer.exit("conv")
            >>> timer.forward_self_seconds()["conv"] < 0.05
            True
        """
        if not self._stack or self._backward_end is not None:
            return
        if self._forward_end is None:
            self._intervals.append((self._stack[-1], self._last, before))
            self._last = after
        else:
            self._backward_stalls.append((before, after))

    def end_forward(self) -> None:
        """The forward pass is over: what follows until :meth:`end_backward` is backward."""
        if self.started and self._forward_end is None:
            self._close_interval()
            del self._stack[1:]
            self._forward_end = self._last

    def end_backward(self) -> None:
        if self.started and self._forward_end is not None:
            self._backward_end = self.clock.mark()

    def forward_self_seconds(self) -> dict[str, float]:
        seconds: dict[str, float] = {}
        for layer, start, end in self._intervals:
            seconds[layer] = seconds.get(layer, 0.0) + self.clock.seconds_between(start, end)
        return seconds

    def backward_seconds(self) -> float:
        """The backward's compute time: from the end of forward to the end of backward, less
        the stalls in between."""
        if self._forward_end is None or self._backward_end is None:
            return 0.0
        stalled = sum(self.clock.seconds_between(before, after) for before, after in self._backward_stalls)
        return max(0.0, self.clock.seconds_between(self._forward_end, self._backward_end) - stalled)


class PassTimer:
    """Forward and backward time of whole passes, three marks each, read without waiting.

    For the steady state, where layers are not timed: a pass's times are read once the
    device has reached its last mark, so on a GPU they usually arrive a pass late (the most
    recent pass read is reported), and the CPU never waits for the device; or at the pass's
    end, waiting for it (``end_backward(wait=True)``). The runtime may tell it of waits of
    compute on copies (:meth:`stall`, while the runtime times them): :attr:`stalls_read` then
    holds the forward's and the backward's of the latest pass read.

    Example:
        >>> timer = PassTimer(WallClock())
        >>> timer.start(); timer.end_forward()
        >>> before = timer.clock.mark(); timer.stall(before, before + 0.5)  # a wait in backward
        >>> forward, backward = timer.end_backward(wait=True)
        >>> forward >= 0 and backward >= 0, timer.stalls_read
        (True, (0.0, 0.5))
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._marks: list[Any] = []
        self._stalls: list[tuple[bool, Any, Any]] = []  # (in backward, before, after)
        self._pending: list[tuple[list[Any], list[tuple[bool, Any, Any]]]] = []
        #: The forward's and the backward's seconds of waits on copies of the latest pass read.
        self.stalls_read = (0.0, 0.0)

    def start(self) -> None:
        self._marks = [self.clock.mark()]
        self._stalls = []

    def end_forward(self) -> None:
        if len(self._marks) == 1:
            self._marks.append(self.clock.mark())

    def stall(self, before: Any, after: Any) -> None:
        """Compute waited on copies between the marks ``before`` and ``after``, in the pass open."""
        if self._marks:
            self._stalls.append((len(self._marks) > 1, before, after))

    def end_backward(self, wait: bool = False) -> tuple[float, float]:
        """Close the pass; the forward and backward seconds of the latest pass read (0 if none):
        with ``wait``, this pass's, the CPU waiting for the device to finish it."""
        if len(self._marks) == 2:
            self._marks.append(self.clock.mark())
            self._pending.append((self._marks, self._stalls))
        self._marks, self._stalls = [], []
        times = (0.0, 0.0)
        while self._pending and (wait or self.clock.ready(self._pending[0][0][2])):
            (start, middle, end), stalls = self._pending.pop(0)
            times = (self.clock.seconds_between(start, middle), self.clock.seconds_between(middle, end))
            waited = [0.0, 0.0]
            for in_backward, before, after in stalls:
                waited[in_backward] += self.clock.seconds_between(before, after)
            self.stalls_read = (waited[0], waited[1])
        del self._pending[:-2]  # a device far behind: keep the last two passes only
        return times


class RecomputationTimer:
    """How long each recomputation of a pass took: two marks around the forward run again.

    On CUDA the marks are events on the stream the backward runs on, so an interval is what the
    recomputation adds to that stream: its kernels' time, or the host's time issuing them when
    the device waits on the host. They are read once the pass is over (:meth:`take`, which waits
    for the device).

    Example:
        >>> timer = RecomputationTimer(WallClock())
        >>> start = timer.clock.mark(); timer.record("block", start)
        >>> [(name, seconds >= 0) for name, seconds in timer.take()]
        [('block', True)]
        >>> timer.take()
        []
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._marks: list[tuple[str, object, object]] = []

    def record(self, segment: str, start: object) -> None:
        """``segment`` was recomputed from the mark ``start`` until now."""
        self._marks.append((segment, start, self.clock.mark()))

    def take(self) -> list[tuple[str, float]]:
        """Each recomputation since the last call, in order: ``(segment, seconds)``."""
        marks, self._marks = self._marks, []
        return [(segment, self.clock.seconds_between(start, end)) for segment, start, end in marks]

    def discard(self) -> None:
        """Forget the marks since the last call (the pass they timed measured nothing)."""
        self._marks = []


class HostWorkTimer:
    """The host's seconds in the engine's own work over one pass, forward and backward apart,
    less the waits on copies inside it that held the host.

    A pass replayed by ordinal with its waits timed runs its saved-tensor hooks and the work
    around its copies through :meth:`timed`, and its runtime tells the waits on copies to
    this timer (:meth:`stall`), which passes them on to ``stalls``. Where the marks are the
    host's clock (``host_marks``: the CPU, whose copies are the host's work and are timed as
    waits) a wait inside the timed work is not the engine's own; on a CUDA device a wait is an
    event the compute stream waits on, and the host goes on. Nothing here runs in a pass whose
    waits are not timed.

    Example:
        >>> timer = HostWorkTimer(PassTimer(WallClock()), host_marks=True)
        >>> timer.start()
        >>> def copy(seconds: float) -> None:  # a copy the runtime timed as a wait
        ...     before = time.perf_counter(); time.sleep(seconds); timer.stall(before, time.perf_counter())
        >>> timed_copy = timer.timed(copy)
        >>> timed_copy(0.02)
        >>> forward, backward = timer.read()  # the copy's 20 ms are not the engine's own
        >>> 0.0 <= forward < 0.02, backward
        (True, 0.0)
    """

    __slots__ = ("_blocked", "_depth", "_phase", "_seconds", "_stalls", "host_marks")

    def __init__(self, stalls: StallListener, host_marks: bool) -> None:
        self._stalls = stalls
        self.host_marks = host_marks
        self._seconds = [0.0, 0.0]
        self._phase = 0  # 0: forward, 1: backward
        self._blocked = 0.0  # seconds of waits inside the timed work, host-clock marks only
        self._depth = 0

    def start(self) -> None:
        """A pass begins: its forward is timed from now."""
        self._seconds = [0.0, 0.0]
        self._phase = 0

    def end_forward(self) -> None:
        """What is timed from now is the backward's."""
        self._phase = 1

    def stall(self, before: Any, after: Any) -> None:
        """Compute waited on copies: told to the pass's listener, and left out of the work timed."""
        self._stalls.stall(before, after)
        if self._depth and self.host_marks:
            self._blocked += after - before

    def timed(self, work: Callable[_Arguments, _Result]) -> Callable[_Arguments, _Result]:
        """``work`` (a saved-tensor hook, the engine's work around its copies), its host time
        added to the pass's (once: work timed inside other timed work is the outer one's)."""

        def timed_work(*args: _Arguments.args, **kwargs: _Arguments.kwargs) -> _Result:
            if self._depth:
                return work(*args, **kwargs)
            start, blocked = time.perf_counter(), self._blocked
            self._depth += 1
            try:
                return work(*args, **kwargs)
            finally:
                self._depth -= 1
                self._seconds[self._phase] += time.perf_counter() - start - (self._blocked - blocked)

        return timed_work

    def read(self) -> tuple[float, float]:
        """The forward's and the backward's seconds of the pass timed."""
        return self._seconds[0], self._seconds[1]
