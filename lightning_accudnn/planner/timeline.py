"""Two-stream timeline simulator: what a swap plan costs in memory and time.

The model (see "The performance model" in DESIGN.md) has one compute stream and one copy
stream, and follows what the offload engine (``lightning_accudnn.ops``) does. Layers
``1..k`` run forward ``F_1..F_k`` then backward ``B_k..B_1``. For a plan (keep or swap per
layer, and a prefetch window):

* static memory ``M`` is resident all step;
* layer ``i``'s ``saved_bytes`` become resident when ``F_i`` starts. Its
  ``resident_bytes`` (the non-swappable part), and all of it when kept, stay until ``B_i``
  ends;
* a swapped layer's ``swappable_bytes`` are copied out on the copy stream (FIFO, one copy at
  a time, ``bytes / d2h_bytes_per_second``) starting no earlier than the end of ``F_i``; they
  stay resident until that copy ends. With a copy-out limit (the engine's
  ``max_copying_out_bytes``), when more bytes than the limit wait for their copy out after
  ``F_i``, the compute stream waits for the oldest copies to end before ``F_{i+1}``
  (counted in ``compute_wait_seconds``); one copy is always allowed in flight;
* prefetch: at the end of ``F_k`` and whenever a swapped layer is consumed (end of its
  ``B_j``), swapped layers are admitted in reverse layer order while the swappable bytes
  admitted and not yet consumed plus the layer's own fit the prefetch window, or when
  nothing admitted is waiting (one layer is always allowed, even if larger than the
  window). An admitted layer's bytes are allocated at once and stay until the end of its
  ``B_j``; its copy in (``bytes / h2d_bytes_per_second``) follows on the same FIFO stream,
  after every copy out and earlier copy in. A layer whose copy out has not finished when it
  is admitted keeps its device copy instead: no copy in, its bytes simply stay;
* ``B_j`` of a swapped layer starts no earlier than the end of its copy in; the compute
  stream waits meanwhile (``compute_wait_seconds``);
* the engine moves saved tensors one at a time, so while the next layer is held back by the
  window, part of it (up to the room left in the window) may already be on the device: the
  peak counts that part at those moments (conservative; it does not change the times).

A layer marked swapped whose ``swappable_bytes`` is 0 has nothing to copy: it is simulated
as kept (no copies, no ordering constraint), and reported as not swapped.

**Instants and ties.** Time is a pair (seconds, ticks): every compute op (``F_i`` or ``B_i``)
lasts its seconds plus one tick, copies last their seconds and no tick, and pairs compare
lexicographically. So a zero-second op still comes after the one before it, and a copy
with infinite bandwidth (zero seconds) is shorter than any compute op: profiles with zero
times and the default infinite bandwidths simulate exactly, in program order. (Equally, a
copy and a compute op that start together and take the same seconds: the copy ends first.)
At one instant (equal pairs):

* the end of ``B_j`` frees its bytes *before* any allocation at that instant (the window
  sees the bytes consumed at that instant as gone);
* the end of a copy out frees its bytes *after* any allocation at that instant
  (conservative: a copy out that finishes exactly when ``F_{i+1}`` starts still counts
  then). With infinite bandwidth this means the previous layer's swapped bytes are counted
  at the start of the next layer, and never later. A layer admitted at the very instant
  its own copy out ends counts as still copying out: it keeps its device copy.

The peak is taken at allocation moments (starts of ``F_i``, admissions, and the moments the
window frees room), which is where the maximum of ``M + resident`` over time is reached.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_accudnn.planner.budget import format_bytes
from lightning_accudnn.profile import StepProfile

__all__ = ["LayerTiming", "Timeline", "prefetch_window_candidates", "simulate"]


@dataclass(frozen=True)
class LayerTiming:
    """When one layer's compute and copies happen in a simulated step (seconds from start).

    Copy times are ``None`` for a layer that is not swapped. ``prefetch_start`` is when a
    swapped layer's bytes are allocated again (admitted by the prefetch window); its copy in
    times are ``None`` when it kept its device copy (still copying out when admitted).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile((LayerProfile("a", 10, 10, 1.0, 2.0),), static_bytes=0)
        >>> simulate(profile, [False], 0).layers[0]
        LayerTiming(name='a', swapped=False, forward_start=0.0, forward_end=1.0, \
backward_start=1.0, backward_end=3.0, copy_out_start=None, copy_out_end=None, \
prefetch_start=None, copy_in_start=None, copy_in_end=None)
    """

    name: str
    swapped: bool
    forward_start: float
    forward_end: float
    backward_start: float
    backward_end: float
    copy_out_start: float | None = None
    copy_out_end: float | None = None
    prefetch_start: float | None = None
    copy_in_start: float | None = None
    copy_in_end: float | None = None


@dataclass(frozen=True)
class Timeline:
    """The simulated step: peak memory, when and why it happens, and the step time.

    ``peak_event`` is ``"static"`` (only static memory: no layers), ``"forward"`` (the peak is
    reached when ``F`` of ``peak_layer`` starts) or ``"prefetch"`` (when ``peak_layer`` is
    admitted by the prefetch window, or partly brought in). ``swap`` is the effective plan
    (layers with nothing swappable are reported as kept).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile(
        ...     (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        ...     static_bytes=1_000, d2h_bytes_per_second=100.0, h2d_bytes_per_second=100.0)
        >>> timeline = simulate(profile, [True, False], prefetch_window_bytes=0)
        >>> timeline.peak_bytes, timeline.step_seconds, timeline.compute_wait_seconds
        (1200, 4.0, 0.0)
        >>> timeline.peak_cause
        "forward of 'b' at 1 s: 1.20 KB"
    """

    peak_bytes: int
    peak_seconds: float
    peak_event: str
    peak_layer: str | None
    step_seconds: float
    forward_seconds: float
    compute_wait_seconds: float
    prefetch_window_bytes: int
    swap: tuple[bool, ...]
    layers: tuple[LayerTiming, ...]

    @property
    def peak_cause(self) -> str:
        """A one-line account of the peak, e.g. ``"prefetch of 'conv3' at 0.012 s: 7.20 GB"``."""
        if self.peak_event == "static":
            return f"static memory: {format_bytes(self.peak_bytes)}"
        moment = f"{self.peak_event} of {self.peak_layer!r} at {self.peak_seconds:.3g} s"
        return f"{moment}: {format_bytes(self.peak_bytes)}"


class _Prepared:
    """Per-profile arrays reused by every simulation of the same profile (the planner's hot path)."""

    __slots__ = (
        "k",
        "names",
        "static",
        "saved",
        "swappable",
        "fwd",
        "bwd",
        "out",
        "inn",
        "prefix_saved",
        "copy_out_limit",
    )

    def __init__(self, profile: StepProfile, copy_out_limit: int | None = None) -> None:
        if copy_out_limit is not None and copy_out_limit < 0:
            raise ValueError(f"max_copying_out_bytes must be >= 0, got {copy_out_limit}")
        self.copy_out_limit = copy_out_limit
        _check_bandwidth(profile.d2h_bytes_per_second, "d2h_bytes_per_second")
        _check_bandwidth(profile.h2d_bytes_per_second, "h2d_bytes_per_second")
        layers = profile.layers
        self.k = len(layers)
        self.names = tuple(layer.name for layer in layers)
        self.static = profile.static_bytes
        self.saved = tuple(layer.saved_bytes for layer in layers)
        self.swappable = tuple(layer.swappable_bytes for layer in layers)
        self.fwd = tuple(float(layer.forward_seconds) for layer in layers)
        self.bwd = tuple(float(layer.backward_seconds) for layer in layers)
        self.out = tuple(w / profile.d2h_bytes_per_second for w in self.swappable)
        self.inn = tuple(w / profile.h2d_bytes_per_second for w in self.swappable)
        prefix = [0]
        for saved in self.saved:
            prefix.append(prefix[-1] + saved)
        self.prefix_saved = tuple(prefix)

    def effective(self, swap: Sequence[bool]) -> tuple[bool, ...]:
        if len(swap) != self.k:
            raise ValueError(f"swap has {len(swap)} entries for a profile of {self.k} layers")
        return tuple(bool(s) and w > 0 for s, w in zip(swap, self.swappable, strict=True))


def _check_bandwidth(value: float, name: str) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0 (float('inf') for free copies), got {value}")


# The result of one run: (peak_bytes, step_seconds, compute_wait_seconds, peak_seconds,
# peak_event, peak_index, forward_seconds, timings or None).
_Run = tuple


def _run(prep: _Prepared, swap: tuple[bool, ...], window: int, record: bool = False) -> _Run:
    """Simulate one step; ``swap`` must already be effective (see :meth:`_Prepared.effective`).

    Times are tuples ``(seconds, ticks)`` so that Python compares them lexicographically.
    """
    k = prep.k
    saved, swappable, fwd, bwd, out, inn = prep.saved, prep.swappable, prep.fwd, prep.bwd, prep.out, prep.inn
    static = prep.static
    peak, peak_at, peak_event, peak_index = static, (0.0, 0), "static", -1

    # ---- forward ----
    now = (0.0, 0)  # compute stream clock
    stream = (0.0, 0)  # copy stream: free from this instant
    copying_out: deque = deque()  # (end, bytes, layer), ends increasing (FIFO)
    copying_bytes = 0
    base = static  # static + every byte of earlier layers that stays until backward
    timings = [None] * k if record else None
    limit = prep.copy_out_limit
    wait = 0.0
    for i in range(k):
        while copying_out and copying_out[0][0] < now:  # ends strictly before: freed first
            copying_bytes -= copying_out.popleft()[1]
        resident = base + copying_bytes + saved[i]
        if resident > peak:
            peak, peak_at, peak_event, peak_index = resident, now, "forward", i
        start = now
        now = (now[0] + fwd[i], now[1] + 1)
        if swap[i]:
            base += saved[i] - swappable[i]
            out_start = now if stream < now else stream
            stream = (out_start[0] + out[i], out_start[1])
            copying_out.append((stream, swappable[i], i))
            copying_bytes += swappable[i]
            if record:
                timings[i] = [start[0], now[0], out_start[0], stream[0]]
            # The engine's throttle: past the limit, the forward waits for the oldest copies out.
            while limit is not None and copying_bytes > limit and len(copying_out) > 1:
                end, nbytes, _ = copying_out.popleft()
                copying_bytes -= nbytes
                if now < end:
                    wait += end[0] - now[0]
                    now = (end[0], max(end[1], now[1]))
        else:
            base += saved[i]
            if record:
                timings[i] = [start[0], now[0], None, None]
    end_forward = now

    # ---- backward ----
    # The engine's prefetch loop runs at the end of the forward and whenever a swapped layer
    # is consumed (the window frees room); it admits swapped layers in prefetch order while
    # they fit the window, allocating their device bytes at once (the copy in follows on the
    # stream when it is free). A layer still copying out when admitted keeps its device copy.
    order = [i for i in range(k - 1, -1, -1) if swap[i]]
    prefix_saved = prep.prefix_saved
    not_admitted = sum(swappable[i] for i in order)  # swappable bytes of swapped layers still away
    waiting: deque = deque()  # admitted and not consumed, in prefetch order
    waiting_bytes = 0
    ready: list = [None] * k  # when a swapped layer's bytes are usable on the device
    admitted = 0  # layers of ``order`` admitted so far

    def prefetch(at: tuple, top: int) -> None:
        """Admit what the window allows at instant ``at``; ``top`` is the highest unconsumed layer."""
        nonlocal admitted, waiting_bytes, not_admitted, copying_bytes, stream
        nonlocal peak, peak_at, peak_event, peak_index
        while copying_out and copying_out[0][0] < at:
            copying_bytes -= copying_out.popleft()[1]
        base = static + prefix_saved[top + 1]
        while admitted < len(order):
            j = order[admitted]
            nbytes = swappable[j]
            still_out = copying_out and copying_out[-1][2] == j
            if waiting_bytes > 0 and waiting_bytes + nbytes > window:
                # The engine moves tensors one by one: part of j may come in already.
                room = window - waiting_bytes
                if room > 0 and not still_out:
                    resident = base - not_admitted + copying_bytes + min(nbytes, room)
                    if resident > peak:
                        peak, peak_at, peak_event, peak_index = resident, at, "prefetch", j
                return
            admitted += 1
            waiting.append(j)
            waiting_bytes += nbytes
            not_admitted -= nbytes
            if still_out:  # its copy out has not finished: the device copy stays, no copy in
                copying_out.pop()
                copying_bytes -= nbytes
                ready[j] = at
                if record:
                    timings[j] += [at[0], None, None]
            else:
                start = at if stream < at else stream
                stream = (start[0] + inn[j], start[1])
                ready[j] = stream
                if record:
                    timings[j] += [at[0], start[0], stream[0]]
            resident = base - not_admitted + copying_bytes
            if resident > peak:
                peak, peak_at, peak_event, peak_index = resident, at, "prefetch", j

    prefetch(end_forward, k - 1)
    for i in range(k - 1, -1, -1):
        if swap[i] and now < ready[i]:  # wait for the copy in
            wait += ready[i][0] - now[0]
            now = ready[i]
        backward_start = now
        now = (now[0] + bwd[i], now[1] + 1)
        if record:
            timings[i] += [backward_start[0], now[0]]
        if swap[i]:
            waiting.popleft()
            waiting_bytes -= swappable[i]
            prefetch(now, i - 1)
    step = max(now[0], stream[0])
    return peak, step, wait, peak_at[0], peak_event, peak_index, end_forward[0], timings


def _timeline(prep: _Prepared, swap: tuple[bool, ...], window: int) -> Timeline:
    peak, step, wait, peak_at, event, index, forward, timings = _run(prep, swap, window, record=True)
    layers = []
    for i, name in enumerate(prep.names):
        row = timings[i]
        if swap[i]:
            f0, f1, o0, o1, p0, i0, i1, b0, b1 = row
            layers.append(LayerTiming(name, True, f0, f1, b0, b1, o0, o1, p0, i0, i1))
        else:
            f0, f1, _, _, b0, b1 = row
            layers.append(LayerTiming(name, False, f0, f1, b0, b1))
    return Timeline(
        peak_bytes=peak,
        peak_seconds=peak_at,
        peak_event=event,
        peak_layer=prep.names[index] if index >= 0 else None,
        step_seconds=step,
        forward_seconds=forward,
        compute_wait_seconds=wait,
        prefetch_window_bytes=window,
        swap=swap,
        layers=tuple(layers),
    )


def simulate(
    profile: StepProfile,
    swap: Sequence[bool],
    prefetch_window_bytes: int,
    max_copying_out_bytes: int | None = None,
) -> Timeline:
    """Simulate one training step of ``profile`` under a plan; see the module docstring.

    ``swap[i]`` says whether layer ``i`` (forward order) is swapped. The prefetch window is
    in bytes of swappable data brought back ahead of use and not yet consumed;
    ``max_copying_out_bytes`` bounds the bytes waiting for their copy out (``None``: no bound).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile(
        ...     (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        ...     static_bytes=0, d2h_bytes_per_second=50.0, h2d_bytes_per_second=50.0)
        >>> timeline = simulate(profile, [True, True], prefetch_window_bytes=0)
        >>> timeline.step_seconds, timeline.compute_wait_seconds
        (8.0, 4.0)
    """
    if prefetch_window_bytes < 0:
        raise ValueError(f"prefetch_window_bytes must be >= 0, got {prefetch_window_bytes}")
    prep = _Prepared(profile, max_copying_out_bytes)
    return _timeline(prep, prep.effective(swap), int(prefetch_window_bytes))


def prefetch_window_candidates(profile: StepProfile, swap: Sequence[bool]) -> tuple[int, ...]:
    """Every prefetch window that behaves differently for this plan, in increasing order.

    The window only enters the simulation through tests ``run + next <= window`` where the
    left side is the sum of a contiguous run of swapped layers' swappable bytes in prefetch
    (reverse layer) order. So any window behaves exactly like the largest of these run sums
    (or 0) that is not above it, and these values are an exhaustive set of windows.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(n, 10 * s, 10 * s) for n, s in (("a", 1), ("b", 2), ("c", 3)))
        >>> prefetch_window_candidates(StepProfile(layers, static_bytes=0), [True, False, True])
        (0, 10, 30, 40)
    """
    prep = _Prepared(profile)
    return _window_candidates(prep, prep.effective(swap))


def _window_candidates(prep: _Prepared, swap: tuple[bool, ...]) -> tuple[int, ...]:
    sizes = [prep.swappable[i] for i in range(prep.k - 1, -1, -1) if swap[i]]
    sums = {0}
    for first in range(len(sizes)):
        total = 0
        for size in sizes[first:]:
            total += size
            sums.add(total)
    return tuple(sorted(sums))
