"""Search for the fastest plan that fits: which layers to swap and how far to prefetch.

Internal to :func:`lightning_accudnn.planner.plan.plan_swaps`; every candidate is scored by the
timeline simulator (:mod:`.timeline`).

Facts the search relies on (they follow from the simulator's rules):

* For a fixed swap set, the step time never increases with the prefetch window (a larger
  window only lets copies in start earlier), and the window only matters through the
  thresholds in :func:`~lightning_accudnn.planner.timeline.prefetch_window_candidates`.
* For a fixed swap set, window 0 gives the least peak: at every copy-in allocation at least
  the layers that are unconsumed under window 0 are unconsumed under any larger window, and
  the forward pass does not depend on the window. So a swap set is feasible iff it fits with
  window 0.
* Swapping every layer is *not* always the least-peak plan: copies out are FIFO, so when
  the copy stream falls behind the forward pass, swapping an early large layer delays the
  copies out (and the frees) of later ones; a set of smaller layers whose copies complete
  before the peak can free more. Exhaustive search sees this; the heuristic approaches it by
  a budget-independent descent from swapping everything.

Choosing the swap set exactly is a subset-sum-like problem (free at least the excess bytes
with the least copy traffic, under timing interactions), so there is no exact polynomial
method to hope for in general: small instances are searched exhaustively, large ones
heuristically (least-peak descent, forward prefixes, window bisection, then a bounded
greedy refinement), with a bounded number of simulations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_accudnn.planner.timeline import _Prepared, _run, _window_candidates

#: Exhaustive search when the profile has at most this many swappable layers...
EXACT_MAX_SWAPPABLE = 10
#: ...and ``2**swappable * layers`` is at most this (bounds the simulated layer-steps).
EXACT_MAX_WORK = 2**14
#: Window bisection in the heuristic stops when the interval is below ``total >> this``.
_WINDOW_BISECTION_BITS = 10
#: Greedy refinement in the heuristic: at most this many layer-steps simulated.
_REFINE_WORK = 150_000
#: Descent towards the least peak in the heuristic: at most this many layer-steps simulated.
_LEAST_PEAK_WORK = 150_000


@dataclass(frozen=True)
class Choice:
    """One evaluated plan: effective swap flags, prefetch window and the simulator's run."""

    swap: tuple[bool, ...]
    window: int
    run: tuple

    @property
    def peak(self) -> int:
        return self.run[0]

    @property
    def step(self) -> float:
        return self.run[1]


@dataclass(frozen=True)
class SearchResult:
    """The best plan that fits (``None`` if none was found) and the least peak of any plan.

    ``min_peak_bytes`` is exact for an exhaustive search; for the heuristic it is the peak of
    the budget-independent least-peak descent (an upper bound on the true least peak, and
    never above swapping everything with window 0). In both cases the search finds a plan
    whenever ``cap >= min_peak_bytes``.
    """

    best: Choice | None
    min_peak_bytes: int
    method: str  # "nothing to swap", "exhaustive" or "heuristic"


def _key(prep: _Prepared, choice: Choice) -> tuple:
    """Order of preference: faster, then fewer bytes copied, then lower peak, then smaller window."""
    swapped = sum(w for s, w in zip(choice.swap, prep.swappable, strict=True) if s)
    return (choice.step, swapped, choice.peak, choice.window)


def search(prep: _Prepared, cap: int) -> SearchResult:
    """The fastest plan with peak at most ``cap`` bytes, and the least peak of any plan."""
    swappable = [i for i in range(prep.k) if prep.swappable[i] > 0]
    n = len(swappable)
    if n == 0:
        run = _run(prep, (False,) * prep.k, 0)
        best = Choice((False,) * prep.k, 0, run) if run[0] <= cap else None
        return SearchResult(best, run[0], "nothing to swap")
    if n <= EXACT_MAX_SWAPPABLE and (1 << n) * max(prep.k, 1) <= EXACT_MAX_WORK:
        return _exhaustive(prep, swappable, cap)
    return _heuristic(prep, swappable, cap)


def _swap_of(k: int, layers: Sequence[int]) -> tuple[bool, ...]:
    swap = [False] * k
    for i in layers:
        swap[i] = True
    return tuple(swap)


def _best_window_exact(
    prep: _Prepared, swap: tuple[bool, ...], cap: int, run0: tuple, beat: float
) -> Choice | None:
    """Smallest window reaching the least time among the windows that fit; ``None`` if that
    time is above ``beat`` (pruned). ``run0`` is the run with window 0 (known to fit)."""
    windows = _window_candidates(prep, swap)
    best: Choice | None = None
    for window in reversed(windows):
        run = run0 if window == 0 else _run(prep, swap, window)
        if best is None:
            if window == windows[-1]:
                if run[1] > beat:
                    return None  # the largest window is the fastest: this set cannot win
                if run[1] >= run0[1]:
                    return Choice(swap, 0, run0)  # every window is as fast as window 0
            if run[0] <= cap:
                best = Choice(swap, window, run)
        else:
            if run[1] > best.step:
                break  # smaller windows are never faster
            if run[0] <= cap:
                best = Choice(swap, window, run)
    return best


def _exhaustive(prep: _Prepared, swappable: list[int], cap: int) -> SearchResult:
    k = prep.k
    best: Choice | None = None
    best_key: tuple | None = None
    min_peak = None
    for mask in range(1 << len(swappable)):
        swap = _swap_of(k, [i for bit, i in enumerate(swappable) if mask >> bit & 1])
        run0 = _run(prep, swap, 0)
        if min_peak is None or run0[0] < min_peak:
            min_peak = run0[0]
        if run0[0] > cap:
            continue
        if mask == 0:
            choice = Choice(swap, 0, run0)
        else:
            choice = _best_window_exact(prep, swap, cap, run0, best.step if best else float("inf"))
            if choice is None:
                continue
        key = _key(prep, choice)
        if best_key is None or key < best_key:
            best, best_key = choice, key
    return SearchResult(best, min_peak, "exhaustive")


class _Heuristic:
    """Forward prefixes, window bisection and a bounded greedy refinement (large profiles)."""

    def __init__(self, prep: _Prepared, swappable: list[int], cap: int) -> None:
        self.prep, self.swappable, self.cap = prep, swappable, cap
        self.best: Choice | None = None
        self.best_key: tuple | None = None
        self.seen: dict[tuple[bool, ...], Choice | None] = {}
        self.layer_steps = 0  # simulated layers so far (the cost measure)

    def sim(self, swap: tuple[bool, ...], window: int) -> tuple:
        self.layer_steps += self.prep.k
        return _run(self.prep, swap, window)

    def offer(self, choice: Choice | None) -> bool:
        if choice is None:
            return False
        key = _key(self.prep, choice)
        if self.best_key is None or key < self.best_key:
            self.best, self.best_key = choice, key
            return True
        return False

    def fits(self, swap: tuple[bool, ...]) -> bool:
        return self.sim(swap, 0)[0] <= self.cap

    def consider(self, swap: tuple[bool, ...]) -> Choice | None:
        """The plan for this swap set with the largest window found to fit (bisection)."""
        if swap in self.seen:
            return self.seen[swap]
        prep, cap = self.prep, self.cap
        run0 = self.sim(swap, 0)
        choice: Choice | None = None
        if run0[0] <= cap:
            total = sum(w for s, w in zip(swap, prep.swappable, strict=True) if s)
            run_all = self.sim(swap, total)
            if run_all[1] >= run0[1]:
                choice = Choice(swap, 0, run0)  # the window buys nothing
            elif run_all[0] <= cap:
                choice = Choice(swap, total, run_all)
            else:
                low, low_run, high = 0, run0, total
                tolerance = max(1, total >> _WINDOW_BISECTION_BITS)
                while high - low > tolerance:
                    middle = (low + high) // 2
                    run = self.sim(swap, middle)
                    if run[0] <= cap:
                        low, low_run = middle, run
                    else:
                        high = middle
                window = _snap_window(prep, swap, low)  # same times, no more memory
                choice = Choice(swap, window, low_run if window == low else self.sim(swap, window))
        self.seen[swap] = choice
        return choice

    def least_peak(self) -> tuple[tuple[bool, ...], tuple]:
        """A low-peak swap set, independent of the budget: steepest descent on the window-0
        peak from swapping everything, flipping layers near the moment of the peak."""
        current = _swap_of(self.prep.k, self.swappable)
        current_run = self.sim(current, 0)
        limit = self.layer_steps + _LEAST_PEAK_WORK
        while self.layer_steps < limit:
            best, best_run = None, current_run
            for i in self._moves_near_peak(current, current_run):
                trial = list(current)
                trial[i] = not trial[i]
                run = self.sim(tuple(trial), 0)
                if (run[0], run[1]) < (best_run[0], best_run[1]) and run[0] < current_run[0]:
                    best, best_run = tuple(trial), run
            if best is None:
                break
            current, current_run = best, best_run
        return current, current_run

    def _moves_near_peak(self, swap: tuple[bool, ...], run: tuple) -> list[int]:
        """Layers whose flip may lower the peak: swappable layers close to the peak's layer."""
        event, at = run[4], run[5]
        if event == "static":
            return []
        if event == "forward":  # what was freed (or is still copying out) before F_at starts
            below = [i for i in self.swappable if i < at]
            swapped = [i for i in reversed(below) if swap[i]]
            kept = [i for i in reversed(below) if not swap[i]]
            largest = sorted(swapped, key=lambda i: -self.prep.swappable[i])
            moves = [*swapped[:6], *kept[:4], *largest[:4]]
        else:  # a copy in: the layer itself and its neighbours
            moves = sorted(self.swappable, key=lambda i: (abs(i - at), i))[:9]
        return list(dict.fromkeys(moves))

    def run(self) -> SearchResult:
        swappable, k = self.swappable, self.prep.k
        n = len(swappable)
        nothing = (False,) * k
        run_nothing = self.sim(nothing, 0)
        least, least_run = self.least_peak()
        min_peak = least_run[0]
        if run_nothing[0] <= self.cap:
            return SearchResult(Choice(nothing, 0, run_nothing), min_peak, "heuristic")
        if min_peak > self.cap:
            return SearchResult(None, min_peak, "heuristic")
        self.offer(self.consider(least))
        self.offer(self.consider(_swap_of(k, swappable)))

        # Smallest forward prefix that fits (window 0), by bisection: prefix 0 does not fit.
        low, high = 0, n
        while high - low > 1:
            middle = (low + high) // 2
            if self.fits(_swap_of(k, swappable[:middle])):
                high = middle
            else:
                low = middle
        first = high
        lengths = sorted({first, *(min(n, first + step) for step in _powers_of_two(n))})
        for length in lengths:
            self.offer(self.consider(_swap_of(k, swappable[:length])))
        self._refine()
        return SearchResult(self.best, min_peak, "heuristic")

    def _refine(self) -> None:
        """Greedy: flip one layer (largest swapped, first kept, near the peak) while that helps."""
        prep = self.prep
        limit = self.layer_steps + _REFINE_WORK
        improved = True
        while improved and self.layer_steps < limit:
            improved = False
            assert self.best is not None
            swap = self.best.swap
            swapped = sorted((i for i in range(prep.k) if swap[i]), key=lambda i: -prep.swappable[i])
            kept = [i for i in self.swappable if not swap[i]]
            near_peak = self._moves_near_peak(swap, self.best.run)
            for i in dict.fromkeys([*swapped[:8], *kept[:4], *near_peak]):
                if self.layer_steps >= limit:
                    break
                trial = list(swap)
                trial[i] = not trial[i]
                if self.offer(self.consider(tuple(trial))):
                    improved = True
                    break


def _snap_window(prep: _Prepared, swap: tuple[bool, ...], window: int) -> int:
    """The largest window candidate not above ``window`` (0 or a contiguous run sum), in O(k).

    Every window test compares such a run sum with the window, so the snapped window admits
    exactly the same layers at the same moments; it only leaves less room for partial fills.
    """
    sizes = [prep.swappable[i] for i in range(prep.k - 1, -1, -1) if swap[i]]
    best, total, first = 0, 0, 0
    for size in sizes:  # every size is > 0: a sliding window finds the largest sum <= window
        total += size
        while total > window:
            total -= sizes[first]
            first += 1
        best = max(best, total)
    return best


def _powers_of_two(n: int) -> list[int]:
    steps, step = [], 1
    while step < n:
        steps.append(step)
        step *= 2
    return steps


def _heuristic(prep: _Prepared, swappable: list[int], cap: int) -> SearchResult:
    return _Heuristic(prep, swappable, cap).run()
