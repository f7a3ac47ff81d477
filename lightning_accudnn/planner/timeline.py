"""What a swap plan costs: memory in issue order (deterministic), time on two streams.

This module follows the engine/planner memory contract: device memory is accounted in the
order the CPU *issues* work and every release is stream-ordered, so the predicted peak is a
function of (profile, plan) only, never of timings. Time is what the two-stream simulation
gives. A plan (:class:`PlanChoice`) is a keep/swap flag per layer, a prefetch window ``w``
and a copy-out limit ``L`` (the engine's ``max_copying_out_bytes``; ``None``: no limit).

Layers ``1..k`` run forward ``F_1..F_k`` then backward ``B_k..B_1``. ``W_i`` is layer
``i``'s swappable bytes when it is swapped (0 when kept), ``S_i`` its saved bytes.

**Memory (an upper bound on the engine's ledger, whatever the CPU's lead, plus working memory).**

* Static memory ``M`` is held all step. At the start of ``F_i`` layer ``i``'s ``S_i`` bytes are
  counted at once.
* Forward in-flight FIFO: a swapped layer's ``W_i`` is pushed when ``F_i`` ends; then, while
  the FIFO holds more than ``L`` bytes and more than one entry, bytes are retired from the
  oldest entry (their device memory goes back). The planner does not know how a layer's
  bytes split into storages, so it takes the worst split the engine (which retires whole
  storages) could meet: older entries retire byte by byte, the newest entry is one storage.
  After layer ``i`` the FIFO therefore holds ``max(W_last, min(L, P))`` bytes, ``P`` being all
  bytes pushed so far and ``W_last`` the newest entry; every engine FIFO is a suffix of it.
* Peak in forward, at the start of ``F_i``: ``M`` + every byte of earlier layers that is not
  swapped (kept layers and non-swappable parts) + the FIFO + ``S_i``.
* End of forward: what is still in the FIFO stays on the device until the layer is consumed
  (leftover ``V_j``, no copy back). The rest, ``R_j = W_j - V_j``, is on the host.
* Backward: retired bytes come back in reverse layer order into memory allocated on the
  compute stream, at most ``w`` bytes brought back and not consumed (one storage always
  allowed); a layer is consumed (everything it holds is freed) when ``B_j`` ends. While
  ``B_i`` runs (from the moment ``B_{i+1}`` has freed its bytes until ``B_i`` has) the device
  holds ``M + sum_{j<=i} (S_j - R_j)`` plus the window's content, counted as
  ``max(R_i, R_n, min(w, sum_{j<=i} R_j))`` where ``n`` is the next layer below ``i`` with
  ``R_n > 0``: the engine may consume ``i``'s storages one by one and refill the window with
  later ones before ``B_i`` ends, or hold one storage of ``n`` alone (so ``R_n`` is at most
  ``n``'s largest record where ``StepProfile.prefetch_order`` lists the records).
* Storages saved again by a later layer (``LayerProfile.resaved_by``: ``W`` bytes of layer
  ``f`` last saved by layer ``p > f``) come back for ``B_p`` and are consumed when ``B_f`` ends.
  The planner does not know which of ``f``'s bytes were retired, so it takes the worst case:
  ``E_i``, the sum over such ``f < i <= p`` of ``H_f(i) = min(R_f, bytes of f re-saved at or
  above i)``, is what ``B_i`` may hold of them. They are in the window: the engine brings records
  back in reverse order of last save and counts each in the window until it is consumed. So the
  records read only below ``i`` come after ``i``'s and those held, and while one of them is on
  the device the last admitted was admitted by the window's rule (within ``w``, or alone); else
  the window holds ``i``'s and the held ones, ``R_i + E_i``. The window's content is counted as
  ``max(R_i + E_i, Q_n, min(w, sum_{j<=i} R_j))``, where the storage admitted alone is one of
  the nearest position ``n < i`` with something to bring: ``Q_n = R_n - H_n(i)`` plus the
  re-saved bytes whose last save is ``n`` replaces ``R_n`` (an ``H_n(i)`` that over-counts ``E_i``
  under-counts ``Q_n`` by no more), at most the largest record of ``n`` and of the layers whose
  bytes arrive there (one record comes alone; a layer's record is at most its swappable bytes
  where the records are not listed). Above the highest swapped layer a held record may have
  been read on demand past the window's opening content: there the content is at most that
  opening content plus ``E_i``. The level never grows when ``R_f`` grows (what ``R_f`` adds to
  ``E_i`` or the window, the kept bytes lose), so the facts below still hold.

**Working memory (what the ledger never sees).** A layer's ``LayerProfile.forward_working_bytes``
``F'_i`` is added to its forward level (what the step holds at most beyond it while ``F_i``
runs: outputs nothing saves yet, a loss's logits) and its ``backward_working_bytes`` ``B'_i`` to
its backward level (activations' gradients, workspaces while ``B_i`` runs). A layer whose
backward rebuilds saves (a recomputed segment's: ``transient_bytes``, the saves rebuilt, are
added to its backward level) runs the forward that rebuilds them inside that backward:
:mod:`.recompute` gives its layer ``F'_i``, the largest of its layers', and ``B'_i``, the largest
of its layers' forward and backward working bytes, on top of the transient. Between the passes
the step holds ``M + StepProfile.outside_working_bytes`` (the optimizer step's temporaries): the
peak is never below it. A swapped storage retired while the model's code still holds it (a
residual block's input until the addition) is still allocated: ``F_i``'s level adds
``min(A_i, bytes retired before F_i)``, ``A_i`` being ``LayerProfile.retired_alive_bytes`` (the
most such bytes a pass that swapped everything met there), and where
``LayerProfile.retired_alive_from`` lists the layers whose storages they are, no more of each
than it retired before ``F_i`` (a storage is retired only if the layer that saved it first is
swapped, and only once the copy-out FIFO let it go: until then the level counts it in
flight). Each term is a constant per layer and plan, or grows by no more than the bytes a swap
or a smaller ``L`` retires, so what follows holds still.

So the peak never increases when a layer is swapped, nor when ``L`` or ``w`` shrink: the least
peak of any plan is swapping every swappable layer with ``L = w = 0``.

**Time (two streams).** Each compute op runs for its seconds. A swapped layer's copy out
(``W_i / d2h``) starts when ``F_i`` has ended and the copy stream is free (one FIFO copy
stream). After the push, while more than ``L`` bytes of whole layers wait in the FIFO and it
holds more than one layer, the oldest layer is retired: the compute stream waits for the end
of its copy (``compute_wait_seconds``). Layers still in the FIFO at the end of forward are
not copied back: the engine reads them where they are. Swapped layers are admitted to the
prefetch window in reverse order at the end of forward and whenever one is consumed, while
the bytes admitted and not consumed plus the next layer's fit ``w`` (or nothing admitted
waits): a retired layer's copy in starts when admitted and the copy stream is free, and
``B_j`` waits for it; a layer the FIFO left takes its bytes in the window too, and the compute
stream waits for the end of its copy out when it is admitted (the engine orders compute after
that copy there, so that its storage may be freed in compute order). A retired layer's
re-saved bytes are copied in at the position of their last save (before ``B_p``, which waits
for them) and leave the window when ``B_f`` ends. The copies a backward reads are admitted
before it starts even when the window is full (re-saved bytes held until ``B_f`` ends can fill
it): the engine cannot run ``B_j`` without them.

A swapped layer's forward and backward take, on top of their compute, the host's time for
its storages: ``StepProfile.swap_host_seconds`` per ``LayerProfile.swappable_storages`` each
(the engine's work per swapped storage, which holds the compute stream up where the host
computes or falls behind issuing; nothing when not measured).

A layer marked swapped whose swappable bytes are 0 has nothing to copy: it is kept (and
reported as not swapped).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from operator import add, and_, attrgetter, sub

from lightning_accudnn.planner.timeline_results import (
    LayerTiming,
    MemoryEstimate,
    PlanChoice,
    SimulationResult,
    StepTimes,
    Timeline,
)
from lightning_accudnn.profile import StepProfile

__all__ = [
    "LayerTiming",
    "MemoryEstimate",
    "PlanChoice",
    "SimulationResult",
    "Simulator",
    "StepTimes",
    "Timeline",
    "limit_candidates",
    "prefetch_window_candidates",
    "simulate",
    "unconstrained_seconds",
]


def _check_bandwidth(value: float, name: str) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0 (float('inf') for free copies), got {value}")


class Simulator:
    """One profile, ready to score many plans: :meth:`memory`, :meth:`times`, :meth:`run`.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> layers = (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0))
        >>> simulator = Simulator(StepProfile(layers, static_bytes=0))
        >>> simulator.memory(PlanChoice((True, True), 0, 0)).peak_bytes
        200
        >>> simulator.memory(PlanChoice((True, False), 0, 0)).peak_bytes
        200
    """

    def __init__(self, profile: StepProfile, transient_bytes: Sequence[int] | None = None) -> None:
        _check_bandwidth(profile.d2h_bytes_per_second, "d2h_bytes_per_second")
        _check_bandwidth(profile.h2d_bytes_per_second, "h2d_bytes_per_second")
        layers = profile.layers
        self.profile = profile
        self.k = len(layers)
        self.names: tuple[str, ...] = tuple(map(attrgetter("name"), layers))
        self.static = profile.static_bytes
        self.saved: tuple[int, ...] = tuple(map(attrgetter("saved_bytes"), layers))
        self.swappable: tuple[int, ...] = tuple(map(attrgetter("swappable_bytes"), layers))
        self._can_swap = tuple(w > 0 for w in self.swappable)
        self.fwd = tuple(map(float, map(attrgetter("forward_seconds"), layers)))
        self.bwd = tuple(map(float, map(attrgetter("backward_seconds"), layers)))
        self.out = tuple(w / profile.d2h_bytes_per_second for w in self.swappable)
        # A swapped layer's forward and backward on the compute stream, with the host's time
        # for its storages (the same tuples as fwd and bwd when that time is not measured).
        host_forward, host_backward = profile.swap_host_seconds
        self.storages: tuple[int, ...] = tuple(map(attrgetter("swappable_storages"), layers))
        #: Whether a swapped storage costs the host time the plan charges (measured and counted).
        self.charges_host = bool((host_forward or host_backward) and any(self.storages))
        self.fwd_swapped, self.bwd_swapped = self.fwd, self.bwd
        if self.charges_host:
            storages = self.storages
            self.fwd_swapped = tuple(f + n * host_forward for f, n in zip(self.fwd, storages, strict=True))
            self.bwd_swapped = tuple(b + n * host_backward for b, n in zip(self.bwd, storages, strict=True))
        position = {name: i for i, name in enumerate(self.names)}
        # Per layer: (index of the later layer that saves it last, bytes), later layers only.
        self.resaved = tuple(
            tuple((position[later], nbytes) for later, nbytes in layer.resaved_by if position[later] > i)
            if layer.resaved_by
            else ()
            for i, layer in enumerate(layers)
        )
        self.has_resaves = any(self.resaved)
        self._index_resaves()
        # Bytes a layer holds on top while its backward runs (a recomputed segment's saves).
        self.transient = tuple(transient_bytes) if transient_bytes is not None else (0,) * self.k
        if len(self.transient) != self.k or any(nbytes < 0 for nbytes in self.transient):
            raise ValueError(f"transient_bytes must hold {self.k} byte counts >= 0, got {transient_bytes}")
        # Working memory (see the module docstring): what F_i and B_i hold beyond their levels,
        # and the least any moment of the step holds (static memory, and between the passes).
        self.forward_working: tuple[int, ...] = tuple(map(attrgetter("forward_working_bytes"), layers))
        self.backward_working: tuple[int, ...] = tuple(map(attrgetter("backward_working_bytes"), layers))
        self.floor = self.static + profile.outside_working_bytes
        self._forward_working = any(self.forward_working)
        # Swapped storages retired while the model's code still holds them, at most, per F_i.
        self.retired_alive: tuple[int, ...] = tuple(map(attrgetter("retired_alive_bytes"), layers))
        self._retired_alive = any(self.retired_alive)
        # Per layer, the layers whose storages those were (index, most bytes), where listed and
        # covering them (else None: the whole of A_i, whatever is swapped).
        self._alive_from = tuple(
            _alive_origins(layer.retired_alive_from, layer.retired_alive_bytes, position) for layer in layers
        )
        # What B_i holds beyond the ledger's level: its transient and its working memory (the
        # transient itself when no working memory is listed: the hot loops read one number).
        self._backward_extra = (
            tuple(map(add, self.transient, self.backward_working))
            if any(self.backward_working)
            else self.transient
        )
        # Model state let go when the forward ended (recomputed layers' weight copies).
        if profile.static_let_go_in_backward:
            self._backward_extra = tuple(map(sub, self._backward_extra, profile.static_let_go_in_backward))
        # The swappable records' layers and bytes in the engine's prefetch order, where they add
        # up to the layers' swappable bytes (else None: the window is counted full).
        self._prefetch = _prefetch_order(profile.prefetch_order, position, self.swappable)
        # Per layer, its largest swappable record (its whole swappable bytes when the records are
        # not listed): the most of it the engine brings back alone, past the window.
        self._largest: tuple[int, ...] = self.swappable
        if self._prefetch is not None:
            largest = [0] * self.k
            for layer, nbytes, _ in self._prefetch:
                if nbytes > largest[layer]:
                    largest[layer] = nbytes
            self._largest = tuple(largest)
        self._last_opening: (
            tuple[tuple[bool, ...], tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]] | None
        ) = None

    def _index_resaves(self) -> None:
        """Per layer whose bytes later layers save again: (layer, [(last save, bytes)] by last
        save, their total bytes); and those layers alone (what the backward terms read)."""
        # Flat tuples of numbers, side by side: the garbage collector stops tracking those (a
        # search keeps many simulators; a tuple or list per layer here would be kept tracked,
        # and make it walk the whole heap of a training process more often).
        firsts: list[int] = []
        lasts: list[tuple[int, ...]] = []
        moved: list[tuple[int, ...]] = []
        totals: list[int] = []
        for first, entries in enumerate(self.resaved):
            if entries:
                by_last: dict[int, int] = {}
                for last, nbytes in entries:
                    by_last[last] = by_last.get(last, 0) + nbytes
                order = sorted(by_last)
                firsts.append(first)
                lasts.append(tuple(order))
                moved.append(tuple(by_last[last] for last in order))
                totals.append(sum(by_last.values()))
        self._resaving = tuple(firsts)
        self._resaved_lasts, self._resaved_moved = tuple(lasts), tuple(moved)
        self._resaved_totals = tuple(totals)
        # The last swap set and limit simulated in forward, with its levels and retired bytes,
        # and the backward terms of the last retired bytes: a search often asks again at once
        # (the time after the memory, another window). Read them, never change them.
        self._last_forward: tuple[tuple[bool, ...], int | None, list[int], list[int]] | None = None
        self._last_terms: tuple[list[int], list[tuple[int, int, int, int, int]]] | None = None

    def effective(self, swap: Sequence[bool]) -> tuple[bool, ...]:
        """``swap`` with layers that have nothing swappable marked kept."""
        if len(swap) != self.k:
            raise ValueError(f"swap has {len(swap)} entries for a profile of {self.k} layers")
        return tuple(map(and_, map(bool, swap), self._can_swap))

    def swap_everything(self) -> tuple[bool, ...]:
        return tuple(w > 0 for w in self.swappable)

    # -- memory ---------------------------------------------------------------------------

    def memory(self, choice: PlanChoice) -> MemoryEstimate:
        """The predicted peak in issue order (see the module docstring); no timings involved."""
        swap = self.effective(choice.swap)
        forward_levels, retired = self._forward_memory(swap, choice.max_copying_out_bytes)
        window = choice.prefetch_window_bytes
        above, opening = self._opening_window(swap, window, retired)
        backward_levels = []
        for i, (kept, needed, nxt, below, early) in enumerate(self._backward_terms(retired)):
            held = max(needed, nxt, min(window, below))
            backward_levels.append(kept + (min(held, opening + early) if i > above else held))
        peak, event, index = self.floor, "static" if self.floor == self.static else "between passes", -1
        for i, level in enumerate(forward_levels):
            if level > peak:
                peak, event, index = level, "forward", i
        for i in range(self.k - 1, -1, -1):
            if backward_levels[i] > peak:
                peak, event, index = backward_levels[i], "backward", i
        return MemoryEstimate(peak, event, index, tuple(forward_levels), tuple(backward_levels))

    def peak_bytes(self, choice: PlanChoice) -> int:
        """``memory(choice).peak_bytes``, faster (the search's hot path).

        Example:
            >>> from lightning_accudnn.profile import LayerProfile
            >>> simulator = Simulator(StepProfile((LayerProfile("a", 10, 10),), static_bytes=5))
            >>> simulator.peak_bytes(PlanChoice((True,), 0, 0))
            15
        """
        swap = self.effective(choice.swap)
        forward_levels, retired = self._forward_memory(swap, choice.max_copying_out_bytes)
        peak = max(self.floor, max(forward_levels, default=0))
        window = choice.prefetch_window_bytes
        above, opening = self._opening_window(swap, window, retired)
        if self.has_resaves:
            for i, (kept, needed, nxt, below, early) in enumerate(self._backward_terms(retired)):
                # kept + max(needed, nxt, min(window, below)), in comparisons (the hot loop)
                level = needed if needed > nxt else nxt
                if below > window:
                    below = window
                if below > level:
                    level = below
                if i > above and level > opening + early:
                    level = opening + early
                level += kept
                if level > peak:
                    peak = level
            return peak
        kept_below, retired_below, next_retired = self.static, 0, 0
        largest = self._largest
        for i, (saved, own, extra) in enumerate(zip(self.saved, retired, self._backward_extra, strict=True)):
            kept_below += saved - own
            retired_below += own
            held = max(own, next_retired, window if window < retired_below else retired_below)
            if i > above and held > opening:
                held = opening
            level = kept_below + extra + held
            if level > peak:
                peak = level
            if own > 0:
                next_retired = own if own < largest[i] else largest[i]
        return peak

    def _opening_window(self, swap: tuple[bool, ...], window: int, retired: Sequence[int]) -> tuple[int, int]:
        """(``h``, ``P``): the highest swapped layer, and at most what the prefetch window holds
        from the backward's start until ``B_h`` beyond what the levels count on the device
        already. The engine admits swapped records in the profile's
        :attr:`~lightning_accudnn.profile.StepProfile.prefetch_order` while the room they take
        fits ``window`` (the first whatever its size), and none leaves before a swapped layer's
        backward ends. A record takes its bytes, or those of its storage when the copy-out FIFO
        left it on the device (once per storage): counting the least room each takes, the walk
        admits every record the engine does. Of a layer's records admitted, ``P`` counts no more
        than its ``retired`` bytes: each of its storages is on the device once at most (where
        saved, or as the copy brought back), the levels count ``W_j - R_j`` of them there
        already, and the engine's FIFO leaves no more of a layer than the planner's does.
        ``(k, 0)`` (no level above ``h``) when the order is not known."""
        above, thresholds, layers, sizes = self._opening_steps(swap)
        if not thresholds:
            return above, 0
        admitted = bisect_right(thresholds, window)
        return above, _capped_sums(layers[:admitted], sizes[:admitted], retired)[-1]

    def _opening_steps(
        self, swap: tuple[bool, ...]
    ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(``h``, ``T``, layers, bytes) for :meth:`_opening_window`: the engine admits the first
        ``m`` swapped records of the prefetch order (their layers and bytes) from the least
        window ``T[m - 1]`` on (``T[0]`` is 0: the first record is admitted whatever its size);
        ``(k, (), (), ())`` when the order is not known."""
        order = self._prefetch
        if order is None:
            return self.k, (), (), ()
        last = self._last_opening
        if last is not None and last[0] == swap:
            return last[1]
        above = max((i for i, swapped in enumerate(swap) if swapped), default=-1)
        thresholds: list[int] = []
        layers: list[int] = []
        sizes: list[int] = []
        taken = 0  # the least room the records admitted take
        for layer, nbytes, least in order:
            if swap[layer]:
                thresholds.append(taken + least if thresholds else 0)
                taken += least
                layers.append(layer)
                sizes.append(nbytes)
        steps = (above, tuple(thresholds), tuple(layers), tuple(sizes))
        self._last_opening = (swap, steps)
        return steps

    def largest_window(self, swap: Sequence[bool], limit: int | None, cap: int) -> int | None:
        """The largest prefetch window whose peak is at most ``cap`` (``None`` if even window 0
        is above it). Memory is the same at every window above both the bytes that come back and
        the room the engine's walk of the prefetch order takes before it admits its last swapped
        record (records of layers the copy-out FIFO left on the device take room too); such a
        window that fits is reported as the largest of those two and the bytes of every swapped
        layer, the largest window that behaves differently in time (:meth:`window_candidates`:
        the layers the FIFO left take their bytes in the window too).

        Example:
            >>> from lightning_accudnn.profile import LayerProfile
            >>> layers = tuple(LayerProfile(name, 100, 100) for name in "abc")
            >>> simulator = Simulator(StepProfile(layers, static_bytes=0))
            >>> simulator.largest_window((True, True, True), 0, 250)  # B_c: c + window <= 250
            150
            >>> simulator.largest_window((True, True, True), 0, 150) is None  # F_b: 200
            True
        """
        swap = self.effective(swap)
        forward_levels, retired = self._forward_memory(swap, limit)
        if max(forward_levels, default=self.floor) > cap or self.floor > cap:
            return None
        above, thresholds, layers, sizes = self._opening_steps(swap)
        largest = sum(retired)
        if thresholds and thresholds[-1] > largest:
            largest = thresholds[-1]
        flat = largest  # memory is the same at every window from here on
        helds = _capped_sums(layers, sizes, retired) if thresholds else []
        for i, (kept, needed, nxt, below, early) in enumerate(self._backward_terms(retired)):
            room = cap - kept
            # the largest window with max(needed, nxt, min(window, below)) <= room
            fits: int | None = (
                None if (needed if needed > nxt else nxt) > room else largest if below <= room else room
            )
            if i > above and helds:  # or with the window's opening content and E_i <= room
                first_over = bisect_right(helds, room - early)
                if first_over > 0:
                    opening = largest if first_over == len(helds) else thresholds[first_over] - 1
                    fits = opening if fits is None or opening > fits else fits
            if fits is None:
                return None
            if fits < largest:
                largest = fits
        if largest == flat:
            return max(flat, sum(self.window_sizes(swap)))
        return largest

    def _forward_memory(self, swap: tuple[bool, ...], limit: int | None) -> tuple[list[int], list[int]]:
        """Levels of each ``F_i`` (at its start, plus its working memory) and the bytes of each
        layer retired in forward."""
        last = self._last_forward
        if last is not None and last[1] == limit and last[0] == swap:
            return last[2], last[3]
        saved, swappable = self.saved, self.swappable
        forward_levels: list[int] = []
        level = forward_levels.append
        held = self.static  # static + bytes of earlier layers that are not swapped
        fifo: deque[int] = deque()  # layers with bytes in flight, oldest first
        left = [0] * self.k  # bytes of each layer still in the FIFO
        fifo_bytes = 0
        alive = self.retired_alive if self._retired_alive else None
        alive_from = self._alive_from
        pushed = 0  # bytes swapped so far: those not in the FIFO are retired
        for i, swapped in enumerate(swap):
            nbytes = saved[i]
            if alive is None:
                level(held + fifo_bytes + nbytes)
            else:
                origins = alive_from[i]
                if origins is None:
                    still = pushed - fifo_bytes
                else:  # of each listed layer swapped, no more than it retired so far
                    still = 0
                    for origin, most in origins:
                        if origin < i and swap[origin]:
                            retired_bytes = swappable[origin] - left[origin]
                            still += most if most < retired_bytes else retired_bytes
                level(held + fifo_bytes + nbytes + min(alive[i], still))
            if not swapped:
                held += nbytes
                continue
            moving = swappable[i]
            held += nbytes - moving
            fifo.append(i)
            left[i] = moving
            fifo_bytes += moving
            pushed += moving
            if limit is None:
                continue
            while fifo_bytes > limit and len(fifo) > 1:
                oldest = fifo[0]
                retire = fifo_bytes - limit
                if left[oldest] <= retire:  # all of it
                    fifo_bytes -= left[oldest]
                    left[oldest] = 0
                    fifo.popleft()
                else:
                    left[oldest] -= retire
                    fifo_bytes -= retire
        retired = [w - still if s else 0 for s, w, still in zip(swap, swappable, left, strict=True)]
        if self._forward_working:
            forward_levels = list(map(add, forward_levels, self.forward_working))
        self._last_forward = (swap, limit, forward_levels, retired)
        return forward_levels, retired

    def _backward_terms(self, retired: list[int]) -> list[tuple[int, int, int, int, int]]:
        """Per layer ``i``: (``M + sum_{j<=i} (S_j - R_j)`` plus what ``B_i`` holds on top,
        its transient and working memory, ``R_i + E_i``, ``Q_n``, ``sum_{j<=i} R_j``, ``E_i``);
        without re-saved storages ``E_i = 0`` and ``Q_n = R_n`` (see the module docstring)."""
        last = self._last_terms
        if last is not None and last[0] is retired:  # kept alive there: no other list has its id
            return last[1]
        terms = (
            self._backward_terms_resaved(retired) if self.has_resaves else self._backward_terms_plain(retired)
        )
        self._last_terms = (retired, terms)
        return terms

    def _backward_terms_plain(self, retired: list[int]) -> list[tuple[int, int, int, int, int]]:
        terms = []
        kept_below = self.static
        retired_below = 0
        next_retired = 0  # R_n of the nearest layer n < i with R_n > 0
        extra = self._backward_extra
        largest = self._largest
        for i in range(self.k):
            kept_below += self.saved[i] - retired[i]
            retired_below += retired[i]
            terms.append((kept_below + extra[i], retired[i], next_retired, retired_below, 0))
            if retired[i] > 0:
                next_retired = retired[i] if retired[i] < largest[i] else largest[i]
        return terms

    def _backward_terms_resaved(self, retired: list[int]) -> list[tuple[int, int, int, int, int]]:
        k = self.k
        if not any(retired[first] for first in self._resaving):
            return self._backward_terms_plain(retired)  # nothing re-saved is retired: no E_i, Q_n = R_n
        # held[f][i]: bytes of f brought back for a later save at or above i, held while B_i runs
        # (only the layers f with bytes held: those re-saved later and retired)
        held: dict[int, dict[int, int]] = {}
        early = [0] * k  # E_i: the sum over f of held[f][i]
        arrivals: dict[int, list[tuple[int, int]]] = {}  # (first, bytes) by last save
        for first, lasts, moves, total in zip(
            self._resaving, self._resaved_lasts, self._resaved_moved, self._resaved_totals, strict=True
        ):
            cap = retired[first]
            if cap == 0:
                continue
            # Held while B_i runs: the bytes re-saved at or above i (capped by those retired),
            # constant between two consecutive last saves (every last save is after first).
            remaining = total
            start = first + 1
            held_first = held[first] = {}
            for last, nbytes in zip(lasts, moves, strict=True):
                share = cap if cap < remaining else remaining
                for i in range(start, last + 1):
                    held_first[i] = share
                    early[i] += share
                start = max(start, last + 1)
                remaining -= nbytes
            for last, moved in zip(lasts, moves, strict=True):
                arrivals.setdefault(last, []).append((first, moved))
        # What is left at position n to bring back while B_i runs (retired bytes less those held
        # early, plus re-saved ones arriving there) depends on i only where something is held or
        # arrives (every arrival comes from a layer that holds bytes); elsewhere it is R_n for
        # every i, and the nearest such position with bytes is carried along instead of a scan
        # below every i.
        varying = sorted({*held, *arrivals})
        count = len(varying)
        varies = set(varying)
        no_arrivals: list[tuple[int, int]] = []
        terms = []
        kept_below = self.static
        retired_below = 0
        saved, transient, largest = self.saved, self._backward_extra, self._largest
        fixed = -1  # the nearest position below i that does not vary, with bytes...
        fixed_content = 0  # ...and those bytes
        # varying[low:high]: the varying positions above fixed and below i (both only grow)
        low = high = 0
        for i in range(k):
            if i > 0:
                n = i - 1
                if retired[n] > 0 and n not in varies:
                    fixed, fixed_content = n, min(retired[n], largest[n])
            own = retired[i]
            kept_below += saved[i] - own
            retired_below += own
            next_retired = fixed_content
            if count:
                while low < count and varying[low] <= fixed:
                    low += 1
                while high < count and varying[high] < i:
                    high += 1
                # the varying positions between that one and i, nearest first
                for at in range(high - 1, low - 1, -1):
                    n = varying[at]
                    held_n = held.get(n)
                    content = retired[n] - (held_n.get(i, 0) if held_n is not None else 0)
                    alone = largest[n] if content > 0 else 0  # the largest record it may bring alone
                    for first, moved in arrivals.get(n, no_arrivals):
                        back = retired[first] - held[first].get(i, 0)
                        if back > 0 and moved > 0:
                            content += back if back < moved else moved
                            alone = max(alone, largest[first])
                    if content > 0:
                        next_retired = content if content < alone else alone
                        break
            held_early = early[i]
            needed = own + held_early
            terms.append((kept_below + transient[i], needed, next_retired, retired_below, held_early))
        return terms

    # -- time -----------------------------------------------------------------------------

    def times(self, choice: PlanChoice) -> StepTimes:
        """The two-stream step time of a plan (see the module docstring)."""
        times, _ = self._simulate_times(self.effective(choice.swap), choice, record=False)
        return times

    def run(self, choice: PlanChoice) -> SimulationResult:
        """Memory and time of ``choice``."""
        choice = PlanChoice(
            self.effective(choice.swap), choice.prefetch_window_bytes, choice.max_copying_out_bytes
        )
        return SimulationResult(choice, self.memory(choice), self.times(choice))

    def timeline(self, choice: PlanChoice) -> Timeline:
        """The full record of one simulated step: :class:`Timeline`."""
        swap = self.effective(choice.swap)
        memory = self.memory(choice)
        times, rows = self._simulate_times(swap, choice, record=True)
        assert rows is not None
        return Timeline(
            peak_bytes=memory.peak_bytes,
            peak_event=memory.peak_event,
            peak_layer=self.names[memory.peak_index] if memory.peak_index >= 0 else None,
            step_seconds=times.step_seconds,
            forward_seconds=times.forward_seconds,
            compute_wait_seconds=times.compute_wait_seconds,
            prefetch_window_bytes=choice.prefetch_window_bytes,
            max_copying_out_bytes=choice.max_copying_out_bytes,
            swap=swap,
            layers=tuple(rows),
            memory=memory,
            static_bytes=self.static,
        )

    def _simulate_times(
        self, swap: tuple[bool, ...], choice: PlanChoice, record: bool
    ) -> tuple[StepTimes, list[LayerTiming] | None]:
        k, fwd, bwd, out, swappable = self.k, self.fwd, self.bwd, self.out, self.swappable
        if self.charges_host:
            fwd = tuple(map(_either, swap, self.fwd_swapped, fwd))
            bwd = tuple(map(_either, swap, self.bwd_swapped, bwd))
        limit, window = choice.max_copying_out_bytes, choice.prefetch_window_bytes
        h2d = self.profile.h2d_bytes_per_second
        now = 0.0  # compute stream clock
        stream = 0.0  # copy stream: free from this instant
        wait = 0.0
        fifo: deque[int] = deque()  # swapped layers waiting in the in-flight FIFO, oldest first
        fifo_bytes = 0
        forward_start = [0.0] * k
        forward_end = [0.0] * k
        out_start: list[float | None] = [None] * k
        out_end = [0.0] * k
        retired = [False] * k
        for i in range(k):
            forward_start[i] = now
            now += fwd[i]
            forward_end[i] = now
            if not swap[i]:
                continue
            start = now if now >= stream else stream  # max(now, stream), as a comparison
            stream = start + out[i]
            out_start[i], out_end[i] = start, stream
            fifo.append(i)
            fifo_bytes += swappable[i]
            while limit is not None and fifo_bytes > limit and len(fifo) > 1:
                oldest = fifo.popleft()
                fifo_bytes -= swappable[oldest]
                retired[oldest] = True
                if now < out_end[oldest]:
                    wait += out_end[oldest] - now
                    now = out_end[oldest]
        end_forward = now

        # Admissions to the prefetch window, in prefetch order: (needed by B of, bytes, owner,
        # copied in). A retired layer's bytes come back for its own backward, except the re-saved
        # ones: for the later layer's. A layer the FIFO left is read where it is (not copied).
        # Sorted by the backward that needs them, last first, then in the order listed here
        # (numbers only, no list per layer: see Simulator.__init__).
        items: list[tuple[int, int, int, int, int, bool]] = []
        for j in range(k):
            if not retired[j]:
                if swap[j]:
                    items.append((-j, len(items), j, swappable[j], j, False))
                continue
            left = swappable[j]
            for last, nbytes in self.resaved[j]:
                moved = min(left, nbytes)
                if moved:
                    items.append((-last, len(items), last, moved, j, True))
                    left -= moved
            if left:
                items.append((-j, len(items), j, left, j, True))
        items.sort()
        order = [(needed_by, nbytes, owner, copied) for _, _, needed_by, nbytes, owner, copied in items]
        admitted = 0
        waiting_bytes = 0
        admitted_at: list[float | None] = [None] * k
        in_start: list[float | None] = [None] * k
        ready = [0.0] * k  # when every copy B_i needs is in
        owned = [0] * k  # bytes each layer holds in the window, freed when its backward ends
        settled = 0.0  # the latest copy out of a layer the FIFO left, admitted: compute waits on it

        def prefetch(at: float, due: int = k) -> None:
            """Admit copies while the window allows, and those needed by ``B_due`` or a later
            backward whatever the window holds (that backward reads them)."""
            nonlocal admitted, waiting_bytes, stream, settled
            while admitted < len(order):
                needed_by, nbytes, owner, copied = order[admitted]
                if needed_by < due and waiting_bytes > 0 and waiting_bytes + nbytes > window:
                    return
                admitted += 1
                waiting_bytes += nbytes
                owned[owner] += nbytes
                if not copied:
                    if out_end[owner] > settled:
                        settled = out_end[owner]
                    continue
                start = at if at >= stream else stream  # max(at, stream), as a comparison
                stream = start + nbytes / h2d
                if admitted_at[owner] is None:
                    admitted_at[owner], in_start[owner] = at, start
                if stream > ready[needed_by]:
                    ready[needed_by] = stream
                if stream > ready[owner]:
                    ready[owner] = stream

        # prefetch admits nothing once every copy is admitted, nor while the window holds back
        # the next copy: both are seen here first, without the call (the search's hot path)
        copies = len(order)
        prefetch(end_forward)
        backward_start = [0.0] * k
        backward_end = [0.0] * k
        for i in range(k - 1, -1, -1):
            if admitted < copies:  # re-saved bytes held in the window may have stopped it
                needed_by, nbytes, _, _ = order[admitted]
                if not (needed_by < i and waiting_bytes > 0 and waiting_bytes + nbytes > window):
                    prefetch(now, due=i)
            if now < settled:  # copies out of layers the FIFO left, admitted since
                wait += settled - now
                now = settled
            if now < ready[i]:  # copies this backward reads: its own and re-saved ones
                wait += ready[i] - now
                now = ready[i]
            backward_start[i] = now
            now += bwd[i]
            backward_end[i] = now
            if owned[i]:
                waiting_bytes -= owned[i]
                if admitted < copies:
                    nbytes = order[admitted][1]
                    if not (waiting_bytes > 0 and waiting_bytes + nbytes > window):  # due k: any
                        prefetch(now)
        times = StepTimes(max(now, stream), end_forward, wait)
        if not record:
            return times, None
        rows = []
        for i, name in enumerate(self.names):
            if swap[i]:
                rows.append(
                    LayerTiming(
                        name,
                        True,
                        forward_start[i],
                        forward_end[i],
                        backward_start[i],
                        backward_end[i],
                        out_start[i],
                        out_end[i],
                        retired[i],
                        admitted_at[i],
                        in_start[i],
                        ready[i] if retired[i] else None,
                    )
                )
            else:
                rows.append(
                    LayerTiming(
                        name, False, forward_start[i], forward_end[i], backward_start[i], backward_end[i]
                    )
                )
        return times, rows

    # -- the choices that behave differently ------------------------------------------------

    def window_sizes(self, swap: tuple[bool, ...]) -> list[int]:
        """What each swapped layer takes in the prefetch window, in the order the window admits
        them (the latest first): a retired layer its copy, one the copy-out FIFO left on the
        device its storages read where they are (so the copy-out limit does not change them)."""
        return [self.swappable[i] for i in range(self.k - 1, -1, -1) if swap[i] and self.swappable[i] > 0]

    def window_candidates(self, swap: tuple[bool, ...]) -> tuple[int, ...]:
        """Windows that behave differently in time: 0 and the sums of contiguous runs of
        :meth:`window_sizes`. Memory grows with the window, so a window between two candidates
        is never better than the lower one."""
        return _run_sums(self.window_sizes(swap))

    def limit_candidates(self, swap: tuple[bool, ...]) -> tuple[int, ...]:
        """Copy-out limits that behave differently in time: 0 and the sums of contiguous runs of
        swapped layers in forward order (memory grows with the limit, as for windows)."""
        return _run_sums([self.swappable[i] for i in range(self.k) if swap[i]])


def _capped_sums(layers: Sequence[int], sizes: Sequence[int], caps: Sequence[int]) -> list[int]:
    """Running sums of ``sizes``, each layer's part no more than its cap (never decreasing).

    Example:
        >>> _capped_sums([0, 1, 0], [5, 7, 5], [6, 10, 6])
        [5, 12, 13]
    """
    sums = []
    counted: dict[int, int] = {}
    total = 0
    for layer, nbytes in zip(layers, sizes, strict=True):
        before = counted.get(layer, 0)
        now = min(caps[layer], before + nbytes)
        counted[layer] = now
        total += now - before
        sums.append(total)
    return sums


def _either(chosen: bool, if_chosen: float, otherwise: float) -> float:
    return if_chosen if chosen else otherwise


def _alive_origins(
    listed: Sequence[tuple[str, int]], most: int, position: dict[str, int]
) -> tuple[tuple[int, int], ...] | None:
    """``listed`` (layer names and bytes) by layer index, or ``None`` when it is empty, names a
    layer not in ``position`` or adds up to less than ``most`` (a profile merged since with
    another pass's bytes)."""
    if not listed or most <= 0:
        return None
    origins = []
    for name, nbytes in listed:
        index = position.get(name)
        if index is None or nbytes < 0:
            return None
        origins.append((index, nbytes))
    return tuple(origins) if sum(nbytes for _, nbytes in origins) >= most else None


def _prefetch_order(
    listed: Sequence[tuple[str, int, int]], position: dict[str, int], swappable: Sequence[int]
) -> tuple[tuple[int, int, int], ...] | None:
    """``listed`` (layer names, bytes, bytes taken in the window at least) by layer index, or
    ``None`` when it is empty or its entries do not add up, layer by layer, to ``swappable``."""
    if not listed:
        return None
    order = []
    totals = [0] * len(swappable)
    for name, nbytes, least in listed:
        index = position.get(name)
        if index is None or nbytes <= 0 or not 0 <= least <= nbytes:
            return None
        totals[index] += nbytes
        order.append((index, nbytes, least))
    return tuple(order) if totals == list(swappable) else None


def _run_sums(sizes: Sequence[int]) -> tuple[int, ...]:
    sums = {0}
    for first in range(len(sizes)):
        total = 0
        for size in sizes[first:]:
            total += size
            sums.add(total)
    return tuple(sorted(sums))


def simulate(
    profile: StepProfile,
    swap: Sequence[bool],
    prefetch_window_bytes: int,
    max_copying_out_bytes: int | None = None,
) -> Timeline:
    """Simulate one training step of ``profile`` under a plan; see the module docstring.

    ``swap[i]`` says whether layer ``i`` (forward order) is swapped; the prefetch window is in
    bytes brought back ahead of use and not yet consumed; ``max_copying_out_bytes`` is the
    copy-out limit (``None``: no limit, so nothing leaves the device before the forward ends).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> profile = StepProfile(
        ...     (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0)),
        ...     static_bytes=0, d2h_bytes_per_second=50.0, h2d_bytes_per_second=50.0)
        >>> timeline = simulate(profile, [True, True], 0, max_copying_out_bytes=0)
        >>> timeline.peak_bytes, timeline.step_seconds, timeline.compute_wait_seconds
        (200, 9.0, 5.0)
    """
    choice = PlanChoice(tuple(bool(s) for s in swap), int(prefetch_window_bytes), max_copying_out_bytes)
    return Simulator(profile).timeline(choice)


def prefetch_window_candidates(profile: StepProfile, swap: Sequence[bool]) -> tuple[int, ...]:
    """Every prefetch window that behaves differently in time for this plan, in increasing order
    (whatever its copy-out limit: the window admits every swapped layer, retired or not).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(n, 10 * s, 10 * s) for n, s in (("a", 1), ("b", 2), ("c", 3)))
        >>> prefetch_window_candidates(StepProfile(layers, static_bytes=0), [True, False, True])
        (0, 10, 30, 40)
    """
    simulator = Simulator(profile)
    return simulator.window_candidates(simulator.effective(swap))


def limit_candidates(profile: StepProfile, swap: Sequence[bool]) -> tuple[int, ...]:
    """Every copy-out limit that behaves differently in time for this plan, in increasing order.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = tuple(LayerProfile(n, 10 * s, 10 * s) for n, s in (("a", 1), ("b", 2), ("c", 3)))
        >>> limit_candidates(StepProfile(layers, static_bytes=0), [True, False, True])
        (0, 10, 30, 40)
    """
    simulator = Simulator(profile)
    return simulator.limit_candidates(simulator.effective(swap))


def unconstrained_seconds(profile: StepProfile) -> float:
    """Step time on a GPU with enough memory: nothing swapped, no copies.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> unconstrained_seconds(StepProfile((LayerProfile("a", 1, 1, 0.5, 1.0),), static_bytes=0))
        1.5
    """
    simulator = Simulator(StepProfile(profile.layers, profile.static_bytes))  # free copies
    return simulator.times(PlanChoice((False,) * simulator.k)).step_seconds
