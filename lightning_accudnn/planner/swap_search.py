"""The keep/swap search for one step: which layers to swap, the copy-out limit and the window.

Internal to :mod:`.search` (and :func:`~lightning_accudnn.planner.plan.plan_swaps`); every
candidate is scored by the public :class:`~lightning_accudnn.planner.timeline.Simulator`.

Facts the search relies on (they follow from the simulator's rules):

* Memory never increases when a layer is swapped or when the copy-out limit or the window
  shrink, so the least peak of any plan is swapping everything swappable with limit 0 and
  window 0, whatever the timings and whatever the budget asked; a swap set is feasible iff it
  fits with limit 0 and window 0.
* Time only changes at the limit and window candidates
  (:meth:`~lightning_accudnn.planner.timeline.Simulator.limit_candidates`,
  :meth:`~lightning_accudnn.planner.timeline.Simulator.window_candidates`) while memory grows
  between them, so only candidates are worth choosing; for a fixed swap set and limit, time
  never increases with the window, so the best window is the largest that fits, or a smaller
  one as fast.

Choosing the swap set exactly is subset-sum-like, so small instances are searched
exhaustively and large ones heuristically (forward prefixes, hidden chains, then a bounded
greedy refinement from the best few sets found), with a bounded number of simulations.

A *hidden chain* (:func:`hidden_chain`) swaps a layer only once the copy of the one swapped
before it has ended, so at copy-out limit 0 each retirement finds its copy done and the compute
never waits in forward, while the copy stream stays busy: the bytes the link can move out
behind the forward are retired. A prefix of the forward order instead retires layers that
follow each other closely, and waits for their copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_accudnn.planner.timeline import PlanChoice, SimulationResult, Simulator

__all__ = [
    "CHAIN_LEVELS",
    "EXACT_MAX_SWAPPABLE",
    "EXACT_MAX_WORK",
    "SearchResult",
    "chain_search",
    "fewest_bytes_swapped",
    "hidden_chain",
    "least_peak_choice",
    "powers_of_two",
    "search",
]

#: Exhaustive search when the profile has at most this many swappable layers...
EXACT_MAX_SWAPPABLE = 10
#: ...and ``2**swappable * layers`` is at most this (bounds the simulated layer-steps).
EXACT_MAX_WORK = 2**14
#: Bisections on the limit and the window stop when the interval is below ``total >> this``.
_BISECTION_BITS = 10
#: Greedy refinement in the heuristic: at most this many layer-steps simulated.
_REFINE_WORK = 150_000
#: Hidden chains are tried with these many of the largest distinct swappable sizes as the
#: least size of a layer they swap.
CHAIN_LEVELS = 6
#: The greedy refinement starts from this many of the best swap sets found.
REFINE_STARTS = 3

_Key = tuple[float, int, int, int, int]


@dataclass(frozen=True)
class SearchResult:
    """The best plan that fits (``None`` if none does) and the least peak of any plan.

    ``min_peak_bytes`` is the peak of swapping everything swappable with limit and window 0:
    the least peak of any plan, so the search finds a plan whenever ``cap >= min_peak_bytes``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> simulator = Simulator(StepProfile((LayerProfile("a", 10, 10),), static_bytes=0))
        >>> result = search(simulator, cap=10)
        >>> result.best.choice.swap, result.min_peak_bytes, result.method
        ((False,), 10, 'exhaustive')
    """

    best: SimulationResult | None
    min_peak_bytes: int
    method: str  # "nothing to swap", "exhaustive" or "heuristic"


def least_peak_choice(simulator: Simulator) -> PlanChoice:
    """The plan with the least peak: swap everything swappable, limit 0, window 0."""
    return PlanChoice(simulator.swap_everything(), 0, 0)


def fewest_bytes_swapped(simulator: Simulator, cap: int) -> tuple[bool, ...]:
    """A swap set within ``cap`` (limit and window 0) that swaps few bytes: from swapping
    everything, each layer, largest first, is kept whenever the rest still fits. Call it
    only when swapping everything fits (``cap >= min_peak_bytes``).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = (LayerProfile("a", 400, 400), *(LayerProfile(name, 100, 100) for name in "bcd"))
        >>> fewest_bytes_swapped(Simulator(StepProfile(layers, static_bytes=1_000)), cap=1_600)
        (False, True, True, True)
    """
    swap = list(simulator.swap_everything())
    for i in sorted(range(simulator.k), key=lambda i: -simulator.swappable[i]):
        if swap[i]:
            swap[i] = False
            if simulator.peak_bytes(PlanChoice(tuple(swap), 0, 0)) > cap:
                swap[i] = True
    return tuple(swap)


def hidden_chain(simulator: Simulator, min_bytes: int) -> tuple[bool, ...]:
    """A swap set whose copies out never make the compute wait at copy-out limit 0.

    Walking the forward order with the compute's clock (forward times, nothing waited for) and
    the copy stream's, a layer with at least ``min_bytes`` swappable bytes is swapped when its
    forward ends no earlier than the copy of the layer swapped before it (the stream is free:
    that layer, retired by this push at limit 0, has nothing left to wait for). Last, the
    swappable layer with the fewest bytes among the later ones whose forward ends once the
    chain's last copy has ended is swapped too, so that the chain's last layer is retired as
    well (the FIFO keeps only that small one). The two-stream simulator judges the result.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0),
        ...           LayerProfile("c", 100, 100, 1.0, 1.0), LayerProfile("d", 10, 10, 2.0, 1.0))
        >>> profile = StepProfile(layers, 0, d2h_bytes_per_second=50.0, h2d_bytes_per_second=50.0)
        >>> hidden_chain(Simulator(profile), 100)  # a's copy ends at 3: b is skipped; d retires c
        (True, False, True, True)
    """
    k = simulator.k
    swap = [False] * k
    ends = []
    clock = 0.0
    for seconds in simulator.fwd:
        clock += seconds
        ends.append(clock)
    free = -math.inf  # when the copy stream has copied every chained layer out
    last = -1
    for i in range(k):
        nbytes = simulator.swappable[i]
        if nbytes > 0 and nbytes >= min_bytes and ends[i] >= free:
            swap[i] = True
            free = ends[i] + simulator.out[i]
            last = i
    if last < 0:
        return tuple(swap)
    tail = [i for i in range(last + 1, k) if simulator.swappable[i] > 0 and ends[i] >= free]
    if tail:
        swap[min(tail, key=lambda i: (simulator.swappable[i], i))] = True
    return tuple(swap)


def _chain_levels(simulator: Simulator) -> list[int]:
    """The least sizes :func:`hidden_chain` is tried with: the largest distinct swappable sizes."""
    return sorted({w for w in simulator.swappable if w > 0}, reverse=True)[:CHAIN_LEVELS]


def chain_search(
    simulator: Simulator, cap: int, host_fits: Callable[[tuple[bool, ...]], bool] | None = None
) -> SimulationResult | None:
    """The fastest :func:`hidden_chain` plan with peak at most ``cap`` (copy-out limit 0, the
    largest window that fits), or ``None``: a few simulations, a quick plan for a step that
    needs swaps before the full :func:`search`, which tries the same plans.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> layers = (LayerProfile("a", 100, 100, 1.0, 1.0), LayerProfile("b", 100, 100, 1.0, 1.0),
        ...           LayerProfile("c", 100, 100, 1.0, 1.0), LayerProfile("d", 10, 10, 2.0, 1.0))
        >>> profile = StepProfile(layers, 0, d2h_bytes_per_second=50.0, h2d_bytes_per_second=50.0)
        >>> result = chain_search(Simulator(profile), cap=300)
        >>> result.choice.swap, result.peak_bytes  # nothing swapped peaks at 310
        ((True, False, True, True), 300)
    """
    finder = _Finder(simulator, cap, None, host_fits)
    finder.offer_chains()
    return finder.best


def search(
    simulator: Simulator,
    cap: int,
    max_limit: int | None = None,
    host_fits: Callable[[tuple[bool, ...]], bool] | None = None,
) -> SearchResult:
    """The fastest plan with peak at most ``cap`` bytes, and the least peak of any plan.

    ``max_limit`` bounds the copy-out limits considered (``None``: any); ``host_fits``, if
    given, says whether a swap set fits the host memory (sets it refuses are never chosen).
    """
    swappable = [i for i in range(simulator.k) if simulator.swappable[i] > 0]
    least = simulator.peak_bytes(least_peak_choice(simulator))
    if not swappable:
        run = simulator.run(PlanChoice((False,) * simulator.k, 0, 0))
        return SearchResult(run if run.peak_bytes <= cap else None, least, "nothing to swap")
    if least > cap:
        exact = (
            len(swappable) <= EXACT_MAX_SWAPPABLE and (1 << len(swappable)) * simulator.k <= EXACT_MAX_WORK
        )
        return SearchResult(None, least, "exhaustive" if exact else "heuristic")
    finder = _Finder(simulator, cap, max_limit, host_fits)
    n = len(swappable)
    if n <= EXACT_MAX_SWAPPABLE and (1 << n) * max(simulator.k, 1) <= EXACT_MAX_WORK:
        for mask in range(1 << n):
            finder.offer_exact(
                _swap_of(simulator.k, [i for bit, i in enumerate(swappable) if mask >> bit & 1])
            )
        return SearchResult(finder.best, least, "exhaustive")
    finder.heuristic(swappable)
    return SearchResult(finder.best, least, "heuristic")


def _swap_of(k: int, layers: Sequence[int]) -> tuple[bool, ...]:
    swap = [False] * k
    for i in layers:
        swap[i] = True
    return tuple(swap)


def _largest_fitting(values: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest value of sorted ``values`` for which ``fits`` holds (``fits`` is monotone)."""
    low, high = -1, len(values)  # fits(values[low]) holds, fits(values[high]) does not
    while high - low > 1:
        middle = (low + high) // 2
        if fits(values[middle]):
            low = middle
        else:
            high = middle
    return values[low] if low >= 0 else None


class _Finder:
    """Keeps the best plan found so far and scores swap sets (exactly or by bisection)."""

    def __init__(
        self,
        simulator: Simulator,
        cap: int,
        max_limit: int | None,
        host_fits: Callable[[tuple[bool, ...]], bool] | None = None,
    ) -> None:
        self.simulator, self.cap, self.max_limit = simulator, cap, max_limit
        self.host_fits = host_fits
        self.best: SimulationResult | None = None
        self.best_key: _Key | None = None
        self.seen: set[tuple[bool, ...]] = set()
        self.set_keys: dict[tuple[bool, ...], _Key] = {}  # each swap set's best plan so far
        self.layer_steps = 0  # simulated layers so far (the cost measure)

    # -- scoring ----------------------------------------------------------------------------
    def peak(self, swap: tuple[bool, ...], window: int, limit: int) -> int:
        self.layer_steps += self.simulator.k
        return self.simulator.peak_bytes(PlanChoice(swap, window, limit))

    def fits(self, swap: tuple[bool, ...], window: int = 0, limit: int = 0) -> bool:
        if self.host_fits is not None and not self.host_fits(swap):
            return False
        return self.peak(swap, window, limit) <= self.cap

    def step(self, swap: tuple[bool, ...], window: int, limit: int) -> float:
        self.layer_steps += self.simulator.k
        return self.simulator.times(PlanChoice(swap, window, limit)).step_seconds

    def key(self, result: SimulationResult) -> _Key:
        choice = result.choice
        swapped = sum(w for s, w in zip(choice.swap, self.simulator.swappable, strict=True) if s)
        limit = choice.max_copying_out_bytes or 0
        return (result.step_seconds, swapped, result.peak_bytes, choice.prefetch_window_bytes, limit)

    def offer(self, swap: tuple[bool, ...], window: int, limit: int) -> bool:
        result = self.simulator.run(PlanChoice(swap, window, limit))
        self.layer_steps += 2 * self.simulator.k
        key = self.key(result)
        known = self.set_keys.get(swap)
        if known is None or key < known:
            self.set_keys[swap] = key
        if self.best_key is None or key < self.best_key:
            self.best, self.best_key = result, key
            return True
        return False

    def best_window(self, swap: tuple[bool, ...], limit: int, windows: Sequence[int]) -> int:
        """The smallest window as fast as the largest one that fits (windows sorted, 0 fits)."""
        self.layer_steps += self.simulator.k
        fitting = self.simulator.largest_window(swap, limit, self.cap)
        assert fitting is not None
        largest = _largest_fitting(windows, lambda w: w <= fitting)
        assert largest is not None
        top = windows.index(largest)
        fastest = self.step(swap, largest, limit)
        low, high = -1, top  # step(windows[high]) == fastest; step(windows[low]) > fastest
        while high - low > 1:
            middle = (low + high) // 2
            if self.step(swap, windows[middle], limit) <= fastest:
                high = middle
            else:
                low = middle
        return windows[high]

    # -- exhaustive -------------------------------------------------------------------------
    def offer_exact(self, swap: tuple[bool, ...]) -> None:
        """Every limit candidate that fits, each with its best window."""
        if not self.fits(swap):
            return
        if not any(swap):
            self.offer(swap, 0, 0)
            return
        windows = self.simulator.window_candidates(swap)  # the same at every limit
        for limit in self.simulator.limit_candidates(swap):
            if self.max_limit is not None and limit > self.max_limit:
                break
            if not self.fits(swap, 0, limit):
                break  # memory grows with the limit
            self.offer(swap, self.best_window(swap, limit, windows), limit)

    # -- hidden chains ----------------------------------------------------------------------
    def offer_chains(self) -> None:
        """Each :func:`hidden_chain` that fits, at limit 0 with the largest window that fits
        (snapped to a window that behaves differently)."""
        simulator = self.simulator
        tried: set[tuple[bool, ...]] = set()
        for level in _chain_levels(simulator):
            swap = hidden_chain(simulator, level)
            if swap in tried or not any(swap):
                continue
            tried.add(swap)
            if not self.fits(swap):
                continue
            self.layer_steps += simulator.k
            window = simulator.largest_window(swap, 0, self.cap)
            assert window is not None  # it fits with window 0
            self.offer(swap, _snap(simulator.window_sizes(swap), window), 0)

    # -- heuristic --------------------------------------------------------------------------
    def consider(self, swap: tuple[bool, ...]) -> bool:
        """A few limits (the largest that fits and smaller ones), each with the largest window
        that fits (by bisection). True if it improved the best plan."""
        if swap in self.seen:
            return False
        self.seen.add(swap)
        if not self.fits(swap):
            return False
        simulator = self.simulator
        swapped = [simulator.swappable[i] for i in range(simulator.k) if swap[i]]
        total = sum(swapped)
        top = total if self.max_limit is None else min(total, self.max_limit)
        largest = self._bisect(top, lambda limit: self.fits(swap, 0, limit))
        windows = simulator.window_sizes(swap)  # the same at every limit
        improved = False
        for limit in sorted({largest, largest // 2, largest // 8, 0}, reverse=True):
            limit = _snap(swapped, limit)
            self.layer_steps += simulator.k
            window = simulator.largest_window(swap, limit, self.cap)
            assert window is not None  # the limit was chosen to fit with window 0
            improved |= self.offer(swap, _snap(windows, window), limit)
        return improved

    @staticmethod
    def _bisect(top: int, fits: Callable[[int], bool]) -> int:
        """The largest value in [0, top] that fits, to within ``top >> _BISECTION_BITS`` (0 fits)."""
        if fits(top):
            return top
        low, high = 0, top
        tolerance = max(1, top >> _BISECTION_BITS)
        while high - low > tolerance:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        return low

    def heuristic(self, swappable: list[int]) -> None:
        k, n = self.simulator.k, len(swappable)
        nothing = (False,) * k
        if self.fits(nothing):
            self.offer(nothing, 0, 0)
            return
        self.consider(_swap_of(k, swappable))
        # Smallest forward prefix that fits, by bisection: prefix 0 does not fit.
        low, high = 0, n
        while high - low > 1:
            middle = (low + high) // 2
            if self.peak(_swap_of(k, swappable[:middle]), 0, 0) <= self.cap:  # the device alone
                high = middle
            else:
                low = middle
        lengths = sorted({high, *(min(n, high + step) for step in powers_of_two(n))})
        for length in lengths:
            self.consider(_swap_of(k, swappable[:length]))
        if self.simulator.charges_host:
            self._offer_fewest_storages(swappable)
        if self.best is None and self.host_fits is not None:  # every prefix passes the host limit
            self.consider(fewest_bytes_swapped(self.simulator, self.cap))
        self.offer_chains()
        self._refine(swappable)

    def _offer_fewest_storages(self, swappable: list[int]) -> None:
        """Where each swapped storage costs the host time: the layers that move the most bytes
        per storage first (in forward order among equals), the shortest run of them that fits
        and a few longer ones, as for forward prefixes. A set of many small storages (a
        normalization's statistics beside its input) costs more than one of few large ones
        moving the same bytes."""
        simulator = self.simulator
        k, n = simulator.k, len(swappable)
        order = sorted(swappable, key=lambda i: (-simulator.swappable[i] / max(1, simulator.storages[i]), i))
        low, high = 0, n
        while high - low > 1:
            middle = (low + high) // 2
            if self.peak(_swap_of(k, order[:middle]), 0, 0) <= self.cap:
                high = middle
            else:
                low = middle
        for length in sorted({high, *(min(n, high + step) for step in powers_of_two(n))}):
            self.consider(_swap_of(k, order[:length]))

    def _refine(self, swappable: list[int]) -> None:
        """Greedy from each of the :data:`REFINE_STARTS` best swap sets found, within one work
        bound: a climb taking the first better flip it meets can settle where a flip it met later
        was the faster way (keeping a larger layer is as fast and swaps fewer bytes), and a larger
        budget, whose search starts elsewhere, would then plan a slower step than a smaller one."""
        starts = sorted(self.set_keys, key=self.set_keys.__getitem__)[:REFINE_STARTS]
        limit = self.layer_steps + _REFINE_WORK
        for start in starts:
            self._climb(start, swappable, limit)

    def _climb(self, start: tuple[bool, ...], swappable: list[int], limit: int) -> None:
        """From ``start``, move to the best set one flip away (of the largest swapped layers and
        the first kept ones: the fastest plan, then the fewest bytes swapped) while it is better
        than the set it flips, until ``limit`` layer-steps."""
        simulator = self.simulator
        swap = start
        while self.layer_steps < limit:
            here = self.set_keys[swap]
            swapped = sorted(
                (i for i in range(simulator.k) if swap[i]), key=lambda i: -simulator.swappable[i]
            )
            kept = [i for i in swappable if not swap[i]]
            best_move: tuple[bool, ...] | None = None
            for i in dict.fromkeys([*swapped[:8], *kept[:6]]):
                if self.layer_steps >= limit:
                    break
                trial = list(swap)
                trial[i] = not trial[i]
                move = tuple(trial)
                self.consider(move)
                found = self.set_keys.get(move)
                if found is not None and found < here:
                    best_move, here = move, found
            if best_move is None:
                return
            swap = best_move


def _snap(sizes: Sequence[int], value: int) -> int:
    """The largest sum of a contiguous run of ``sizes`` (all > 0) not above ``value``, or 0."""
    best, total, first = 0, 0, 0
    for size in sizes:
        total += size
        while total > value:
            total -= sizes[first]
            first += 1
        best = max(best, total)
    return best


def powers_of_two(n: int) -> list[int]:
    steps, step = [], 1
    while step < n:
        steps.append(step)
        step *= 2
    return steps
