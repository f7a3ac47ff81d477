"""Search for the fastest plan that fits: which segments to recompute (whole or selectively),
then which layers to swap, the copy-out limit and the window.

Internal to :func:`lightning_accudnn.planner.plan.plan_swaps`; every candidate is scored by
the public :class:`~lightning_accudnn.planner.timeline.Simulator`, the keep/swap part by
:mod:`.swap_search`.

:func:`search_mixed` adds recomputation: for each recompute set it searches the keep/swap
plan of the step the engine would then see (:mod:`.recompute`), and keeps the fastest. With
few candidates every non-overlapping set is searched; with many, the sets come from the
frontier of :mod:`.frontier` (the cheapest set for each amount of bytes freed, by a dynamic
program over the forward order) and from its transient-aware dynamic program (the cheapest set
that fits, :func:`fitting_sets`), each simulated exactly; those that still need swaps get a
quick plan (a few simulations of hidden chains, :func:`~.swap_search.chain_search`), and only a
few of them the full keep/swap search, ranked and pruned by a proved lower bound on their step.
The transient-aware program and the smallest budget are also offered nested candidates
(:func:`nested_spans`: a stage recomputed with its blocks recomputed again inside it), for
budgets one level of recomputation cannot reach; with few candidates (every subset searched),
none are nested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from lightning_accudnn.planner.frontier import fitting_set, recompute_frontier
from lightning_accudnn.planner.recompute import (
    LastProfileMemo,
    RecomputedProfile,
    SegmentSpan,
    inner_spans,
    nested_span,
    policy_spans,
    recomputed_profile,
    set_key,
)
from lightning_accudnn.planner.swap_search import (
    SearchResult,
    chain_search,
    fewest_bytes_swapped,
    least_peak_choice,
    powers_of_two,
    search,
)
from lightning_accudnn.planner.timeline import PlanChoice, SimulationResult, Simulator
from lightning_accudnn.profile import StepProfile

__all__ = [
    "EXACT_MAX_SEGMENTS",
    "KEEP_OR_RECOMPUTE",
    "HostFits",
    "POLICIES",
    "MixedResult",
    "SearchResult",
    "check_policy",
    "fewest_bytes_swapped",
    "fitting_sets",
    "frontier_sets",
    "least_peak_choice",
    "nested_spans",
    "planned_sets",
    "recompute_sets",
    "search",
    "search_mixed",
    "span_groups",
]

#: The policies a plan may follow: what it may do with a layer besides keeping it.
POLICIES = ("auto", "swap", "recompute", "selective")
#: The policies that never swap (every layer is kept or in a recomputed segment).
KEEP_OR_RECOMPUTE = ("recompute", "selective")
#: Every non-overlapping set of recompute candidates is searched when there are at most this many.
EXACT_MAX_SEGMENTS = 6
#: Whether a plan fits the host memory: the profile's layers it swaps, and the bytes of the
#: recomputed segments' inputs it swaps.
HostFits = Callable[[tuple[bool, ...], int], bool]

#: The frontiers and nested candidates of the last profile searched: one plan asks for them
#: several times (for the smallest budget, then for the search), a table at many budgets too.
_memo = LastProfileMemo()


def check_policy(policy: str) -> str:
    """``policy`` if it is one of :data:`POLICIES`, else a ``ValueError`` naming them.

    Example:
        >>> check_policy("auto")
        'auto'
    """
    if policy not in POLICIES:
        raise ValueError(
            f"policy must be one of {', '.join(repr(p) for p in POLICIES)} (keep, swap or recompute, "
            f"whichever is fastest; keep or swap; keep or recompute; keep or recompute selectively), "
            f"got {policy!r}"
        )
    return policy


@dataclass(frozen=True)
class MixedResult:
    """The best keep/swap/recompute plan that fits (``None`` if none does) and the least peak.

    ``step`` is the step the engine sees under the best plan's recomputed segments (see
    :mod:`~lightning_accudnn.planner.recompute`); ``best`` is scored on it.
    ``min_peak_bytes`` is the least peak over the recompute sets of :func:`planned_sets`, each
    with everything swappable swapped at limit and window 0; those sets depend on the profile
    only, so any cap of at least that much finds a plan (and a smaller one none).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, StepProfile
        >>> result = search_mixed(StepProfile((LayerProfile("a", 10, 10),), static_bytes=0), cap=10)
        >>> result.best.choice.swap, result.step.recomputed, result.min_peak_bytes
        ((False,), (), 10)
    """

    best: SimulationResult | None
    step: RecomputedProfile | None
    min_peak_bytes: int
    method: str


def recompute_sets(
    spans: Sequence[SegmentSpan], nested: Sequence[SegmentSpan] = ()
) -> list[tuple[SegmentSpan, ...]]:
    """The recompute sets whose least peak bounds the smallest budget: they depend on the
    candidates' bytes only (never on timings), so the smallest budget does not either.

    Up to :data:`EXACT_MAX_SEGMENTS` candidates: every non-overlapping subset of them and of
    the ``nested`` ones (:func:`nested_spans`, each overlapping its stage). Beyond: the
    candidates that save the fewest bytes first (the smallest transient in backward: blocks
    before the stages that hold them), taken greedily without overlap, and the prefixes of
    that order of length 0, 1, 4, 16, ... and all.

    Example:
        >>> spans = [SegmentSpan("a", 0, 1, 0, 10, 1.0), SegmentSpan("a.x", 1, 1, 0, 5, 1.0)]
        >>> [[span.name for span in chosen] for chosen in recompute_sets(spans)]
        [[], ['a'], ['a.x']]
    """
    if len(spans) <= EXACT_MAX_SEGMENTS:
        every = sorted((*spans, *nested), key=lambda span: (span.first, -span.last, span.selective))
        sets: list[tuple[SegmentSpan, ...]] = []
        for mask in range(1 << len(every)):
            chosen = tuple(span for bit, span in enumerate(every) if mask >> bit & 1)
            if all(not a.overlaps(b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]):
                sets.append(chosen)
        return sets
    return _prefixes(spans, lambda span: span.saved_bytes)


def faster_recompute_sets(spans: Sequence[SegmentSpan]) -> list[tuple[SegmentSpan, ...]]:
    """More sets worth timing when the candidates are too many for every subset: prefixes of
    the candidates that free the most bytes per second of forward (the cheapest to recompute),
    among those that save no more than the largest candidate holding no other.

    Example:
        >>> faster_recompute_sets([SegmentSpan("a", 0, 1, 0, 10, 1.0)])
        []
    """
    if len(spans) <= EXACT_MAX_SEGMENTS:
        return []
    largest = max(span.saved_bytes for span in _innermost(spans))
    small = [span for span in spans if span.saved_bytes <= largest]
    return _prefixes(small, lambda span: -span.freed_bytes / max(span.recompute_seconds, 1e-12))


def _innermost(spans: Sequence[SegmentSpan]) -> list[SegmentSpan]:
    """The candidates that hold no other over fewer layers (a segment's selective twin, over the
    same layers, does not count)."""
    return [
        span
        for span in spans
        if not any(
            span.holds(other) and (other.first, other.last) != (span.first, span.last) for other in spans
        )
    ]


def _prefixes(
    spans: Sequence[SegmentSpan], key: Callable[[SegmentSpan], float]
) -> list[tuple[SegmentSpan, ...]]:
    order = sorted(range(len(spans)), key=lambda i: (key(spans[i]), spans[i].first, i))
    picked: list[SegmentSpan] = []
    for i in order:
        if all(not spans[i].overlaps(other) for other in picked):
            picked.append(spans[i])
    lengths = sorted({0, len(picked), *powers_of_two(len(picked))[::2]})  # 1, 4, 16, ...
    return [tuple(picked[:length]) for length in lengths]


#: With many candidates, at most this many recompute sets that need swaps (besides recomputing
#: nothing) get the full keep/swap search, the most promising first by the reduction.
SWAP_SEARCHED_SETS = 3
#: The frontier is computed under at most this many limits on a recomputed segment's saves.
TRANSIENT_LEVELS = 6
#: On each frontier, the sets just before the first that fits with nothing swapped...
FRONTIER_NEIGHBOURS = 6
#: ...and this many more spread below them are simulated.
FRONTIER_SAMPLES = 8

_MixedKey = tuple[float, float, int, int, int, int]


def search_mixed(
    profile: StepProfile,
    cap: int,
    max_limit: int | None = None,
    policy: str = "auto",
    host_fits: HostFits | None = None,
) -> MixedResult:
    """The fastest plan with peak at most ``cap`` under ``policy`` (see :data:`POLICIES`).

    ``host_fits``, if given, tells whether swapping the profile's layers marked true, and the
    recomputed segments' inputs of the bytes given, fits the host memory; plans that do not are
    never chosen.

    Each recompute set searched is turned into the step the engine would see and searched for
    its best keep/swap plan (:func:`search`), where its segments' inputs may be swapped both so
    and with them kept (the search is a heuristic that more layers to swap can lead to a slower
    plan); the fastest wins, then the one that recomputes
    less, copies less, peaks lower, then the smaller window and limit. With few candidates
    every set of :func:`recompute_sets` is searched. With many, the sets are the frontier of
    :func:`frontier_sets` (the cheapest set for each amount of bytes freed), the set of
    :func:`recompute_sets` with the least peak and :func:`faster_recompute_sets`; each is
    simulated exactly: a set whose step fits with nothing swapped is scored so (swapping never
    makes a step faster); those that need swaps are ranked by the copy time the bytes over the
    budget force at the link rates (a lower bound on their step) and, while that bound can beat
    the best plan found, each gets its quick hidden-chain plans
    (:func:`~lightning_accudnn.planner.swap_search.chain_search`); then recomputing nothing and
    the :data:`SWAP_SEARCHED_SETS` most promising get the keep/swap search, each only while its
    compute alone can still beat the best plan found. Sets that the transient-aware program
    gives with :data:`CHAIN_SHARES` of the hideable bytes left to swap get the quick plans only.
    """
    check_policy(policy)
    spans = policy_spans(profile, policy)
    swappable = policy not in KEEP_OR_RECOMPUTE
    if len(spans) > EXACT_MAX_SEGMENTS:
        return _search_many(profile, spans, cap, max_limit, swappable, host_fits)
    best: SimulationResult | None = None
    best_step: RecomputedProfile | None = None
    best_key: _MixedKey | None = None
    least: int | None = None
    exact = True
    steps: dict[tuple[tuple[str, bool], ...], RecomputedProfile] = {}
    for chosen in recompute_sets(spans, nested_spans(profile, spans)):
        known = set_key(chosen)
        if known not in steps:
            steps[known] = recomputed_profile(profile, chosen, swappable=swappable)
    # Least recomputation first: a set whose compute alone (nothing swapped, so nothing waited
    # for) is slower than the best plan so far can only lose, and is not searched.
    for step in sorted(steps.values(), key=lambda step: step.recompute_seconds):
        simulator = Simulator(step.profile, step.transient_bytes)
        if best_key is not None and _cannot_win(simulator, step, best_key):
            peak = _least_peak(step)
            least = peak if least is None else min(least, peak)
            continue
        for variant, variant_simulator in _search_variants(profile, step, simulator):
            step_fits = None if host_fits is None else _on_profile(host_fits, variant)
            result = search(variant_simulator, cap, max_limit, step_fits)
            exact = exact and result.method != "heuristic"
            least = result.min_peak_bytes if least is None else min(least, result.min_peak_bytes)
            if result.best is None:
                continue
            key = _mixed_key(result.best, variant, variant_simulator)
            if best_key is None or key < best_key:
                best, best_step, best_key = result.best, variant, key
    assert least is not None  # the empty set is always searched
    return MixedResult(best, best_step, least, "exhaustive" if exact else "heuristic")


def _mixed_key(result: SimulationResult, step: RecomputedProfile, simulator: Simulator) -> _MixedKey:
    choice = result.choice
    swapped = sum(w for s, w in zip(choice.swap, simulator.swappable, strict=True) if s)
    return (
        result.step_seconds,
        step.recompute_seconds,
        swapped,
        result.peak_bytes,
        choice.prefetch_window_bytes,
        choice.max_copying_out_bytes or 0,
    )


def _compute_only(simulator: Simulator) -> SimulationResult:
    return simulator.run(PlanChoice((False,) * simulator.k, 0, 0))


def _cannot_win(simulator: Simulator, step: RecomputedProfile, best_key: _MixedKey) -> bool:
    """Whether every plan of ``step`` is beaten by ``best_key``: its compute alone (nothing
    swapped, so nothing waited for) is slower, or as fast with more recomputation."""
    compute_only = simulator.times(PlanChoice((False,) * simulator.k, 0, 0)).step_seconds
    best_seconds, best_recompute = best_key[0], best_key[1]
    return compute_only > best_seconds * (1 + 1e-9) or (
        compute_only >= best_seconds and step.recompute_seconds > best_recompute
    )


def frontier_sets(profile: StepProfile, spans: Sequence[SegmentSpan]) -> list[tuple[SegmentSpan, ...]]:
    """The recompute sets worth simulating when there are too many for every subset: for each
    of up to :data:`TRANSIENT_LEVELS` limits on what a recomputed segment saves (its transient
    in backward: the largest innermost candidate's, then the larger ones'), the frontier of
    :func:`~lightning_accudnn.planner.frontier.recompute_frontier` over the candidates within
    it. They depend on the profile only (never on the budget).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> names = [f"s.b{i}.{part}" for i in range(2) for part in "xy"]
        >>> layers = tuple(LayerProfile(name, 50, 50, 1.0, 2.0) for name in names)
        >>> segments = (SegmentProfile("s", 10), SegmentProfile("s.b0", 10), SegmentProfile("s.b1", 10))
        >>> profile = StepProfile(layers, 0, segments=segments)
        >>> spans = policy_spans(profile, "auto")
        >>> [[span.name for span in chosen] for chosen in frontier_sets(profile, spans)]
        [[], ['s.b0'], ['s.b0', 's.b1'], ['s']]
    """
    sets: dict[tuple[tuple[str, bool], ...], tuple[SegmentSpan, ...]] = {}
    for frontier in _frontiers(profile, spans):
        for chosen in frontier:
            sets.setdefault(set_key(chosen), chosen)
    return list(sets.values())


def _frontiers(profile: StepProfile, spans: Sequence[SegmentSpan]) -> list[list[tuple[SegmentSpan, ...]]]:
    """One frontier per limit on what a recomputed segment saves (see :func:`frontier_sets`);
    the same lists for the same question about the same profile (read them, never change them)."""
    return _memo.get(profile, ("frontiers", tuple(spans)), lambda: _frontiers_of(profile, spans))


def _frontiers_of(profile: StepProfile, spans: Sequence[SegmentSpan]) -> list[list[tuple[SegmentSpan, ...]]]:
    if not spans:
        return [[()]]
    innermost = max(span.saved_bytes for span in _innermost(spans))
    larger = sorted({span.saved_bytes for span in spans if span.saved_bytes > innermost})
    if len(larger) >= TRANSIENT_LEVELS:  # spread the levels over the larger ones, the largest last
        step = len(larger) / (TRANSIENT_LEVELS - 1)
        picks = (min(len(larger) - 1, round((i + 1) * step) - 1) for i in range(TRANSIENT_LEVELS - 1))
        larger = [larger[pick] for pick in picks]
    again = not profile.resaves_listed
    return [
        recompute_frontier(
            [span for span in spans if span.saved_bytes <= level],
            len(profile.layers),
            outputs_counted_again=again,
        )
        for level in (innermost, *larger)
    ]


def _search_many(
    profile: StepProfile,
    spans: Sequence[SegmentSpan],
    cap: int,
    max_limit: int | None,
    swappable: bool,
    host_fits: HostFits | None,
) -> MixedResult:
    """:func:`search_mixed` with more candidates than :data:`EXACT_MAX_SEGMENTS`."""
    sets = _SetScores(profile, cap, swappable)
    bounding = planned_sets(profile, spans)
    least = min(sets.score(chosen).least_peak for chosen in bounding)
    if cap < least:  # below the smallest budget named: refused, whatever else might fit
        return MixedResult(None, None, least, "heuristic")
    for group in span_groups(spans):
        for chosen in faster_recompute_sets(group):
            sets.score(chosen)
        for frontier in _frontiers(profile, group):
            sets.walk(frontier)
    for group in span_groups(spans):  # each kind alone as its own policy asks (nothing swapped)
        nested = nested_spans(profile, group)  # where one level of recomputation cannot fit, two may
        for chosen in fitting_sets(profile, (*group, *nested), cap, swappable and len(group) == len(spans)):
            sets.score(chosen)
    searchable = set(sets.scores)  # the sets the full keep/swap search may take
    if swappable:  # sets that leave more to swap, for the quick plans only
        nested = nested_spans(profile, spans)
        for chosen in fitting_sets(profile, (*spans, *nested), cap, True, CHAIN_SHARES, (1.0,)):
            sets.score(chosen)
    best: SimulationResult | None = None
    best_step: RecomputedProfile | None = None
    best_key: _MixedKey | None = None

    def offer(result: SimulationResult, step: RecomputedProfile, simulator: Simulator) -> None:
        nonlocal best, best_step, best_key
        key = _mixed_key(result, step, simulator)
        if best_key is None or key < best_key:
            best, best_step, best_key = result, step, key

    # A set whose step fits with nothing swapped is scored exactly (swapping never makes a
    # step faster). The others are ranked by the copy bound, a proved lower bound on every plan
    # of the set (the bytes over the budget go out in forward and come back in backward), and
    # searched least first (recomputing nothing always), while the bound can beat the best.
    needing: list[tuple[float, int, _SetScore, bool]] = []
    for order, (names, score) in enumerate(sets.scores.items()):
        if score.plain.peak_bytes <= cap:
            offer(score.plain, score.step, score.simulator)
        elif score.least_peak <= cap:
            bound = _copy_bound(score.step.profile, score.plain.peak_bytes - cap)
            needing.append((bound, order if score.step.recomputed else -1, score, names in searchable))
    needing.sort(key=lambda entry: entry[:2])
    # A quick plan for each of them first (a few simulations: hidden chains, which the full
    # search tries too), so that the full search below starts from a better plan to beat.
    for bound, _, score, _ in needing:
        if best is not None and bound > best.step_seconds * (1 + 1e-9):
            break
        for step, simulator in score.variants:
            step_fits = None if host_fits is None else _on_profile(host_fits, step)
            chained = chain_search(simulator, cap, step_fits)
            if chained is not None:
                offer(chained, step, simulator)
    searched = 0
    for bound, _, score, full in needing:
        if best is not None and bound > best.step_seconds * (1 + 1e-9):
            break
        if not full:
            continue
        recomputes = bool(score.step.recomputed)
        if recomputes and searched >= SWAP_SEARCHED_SETS and best is not None:
            continue
        if best_key is not None and _cannot_win(score.simulator, score.step, best_key):
            continue
        for step, simulator in score.variants:
            step_fits = None if host_fits is None else _on_profile(host_fits, step)
            result = search(simulator, cap, max_limit, step_fits)
            if result.best is not None:
                offer(result.best, step, simulator)
        searched += recomputes
    return MixedResult(best, best_step, least, "heuristic")


@dataclass(frozen=True)
class _SetScore:
    """A recompute set's step, its simulator, its plan with nothing swapped and its least peak
    (simulated when first asked for: a set that fits with nothing swapped never needs it)."""

    profile: StepProfile
    step: RecomputedProfile
    simulator: Simulator
    plain: SimulationResult

    @cached_property
    def least_peak(self) -> int:
        return self.simulator.peak_bytes(least_peak_choice(self.simulator))

    @cached_property
    def variants(self) -> list[tuple[RecomputedProfile, Simulator]]:
        """The steps the keep/swap search takes for this set (:func:`_search_variants`)."""
        return _search_variants(self.profile, self.step, self.simulator)


class _SetScores:
    """Recompute sets simulated so far (each once), by their names."""

    def __init__(self, profile: StepProfile, cap: int, swappable: bool) -> None:
        self.profile, self.cap, self.swappable = profile, cap, swappable
        self.scores: dict[tuple[tuple[str, bool], ...], _SetScore] = {}

    def score(self, chosen: tuple[SegmentSpan, ...]) -> _SetScore:
        names = set_key(chosen)
        known = self.scores.get(names)
        if known is None:
            step = recomputed_profile(self.profile, chosen, swappable=self.swappable)
            simulator = Simulator(step.profile, step.transient_bytes)
            known = self.scores[names] = _SetScore(self.profile, step, simulator, _compute_only(simulator))
        return known

    def fits_plain(self, chosen: tuple[SegmentSpan, ...]) -> bool:
        return self.score(chosen).plain.peak_bytes <= self.cap

    def walk(self, frontier: Sequence[tuple[SegmentSpan, ...]]) -> None:
        """Simulate the sets of ``frontier`` (least bytes freed first) worth it: by bisection the
        first that fits with nothing swapped (the peak falls as more is freed, nearly always),
        the :data:`FRONTIER_NEIGHBOURS` before it, and :data:`FRONTIER_SAMPLES` spread below them
        (sets that need swaps: fewer bytes over the budget against more recomputation)."""
        count = len(frontier)
        if count == 0:
            return
        if self.fits_plain(frontier[-1]):
            low, high = -1, count - 1  # high fits; low does not (or is before the first)
            while high - low > 1:
                middle = (low + high) // 2
                if self.fits_plain(frontier[middle]):
                    high = middle
                else:
                    low = middle
            boundary = high
        else:
            boundary = count
        for index in range(max(0, boundary - FRONTIER_NEIGHBOURS), boundary):
            self.score(frontier[index])
        below = max(0, boundary - FRONTIER_NEIGHBOURS)
        for sample in range(FRONTIER_SAMPLES):
            self.score(frontier[below * sample // FRONTIER_SAMPLES])


def planned_sets(profile: StepProfile, spans: Sequence[SegmentSpan]) -> list[tuple[SegmentSpan, ...]]:
    """The recompute sets whose least peak bounds the smallest budget (they depend on the
    profile only, never on timings or the budget): for each group of :func:`span_groups`,
    :func:`recompute_sets`, and with more candidates than :data:`EXACT_MAX_SEGMENTS` also the
    set of each frontier of :func:`frontier_sets` that frees the most.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> profile = StepProfile((LayerProfile("a.y", 5, 5), LayerProfile("a.x", 5, 5)), 0)
        >>> spans = [SegmentSpan("a", 0, 1, 0, 10, 1.0), SegmentSpan("a.x", 1, 1, 0, 5, 1.0)]
        >>> [[span.names for span in chosen] for chosen in planned_sets(profile, spans)]
        [[], [('a',)], [('a', 'a.x')], [('a.x',)]]
    """
    sets: list[tuple[SegmentSpan, ...]] = []
    for group in span_groups(spans):
        sets += recompute_sets(group, nested_spans(profile, group))
        if len(group) > EXACT_MAX_SEGMENTS:
            most = [frontier[-1] for frontier in _frontiers(profile, group)]
            sets += most
            nested = {span.name: span for span in nested_spans(profile, group)}
            sets += [
                nesting
                for chosen in most
                if (
                    nesting := tuple(
                        nested.get(span.name, span) if not span.selective else span for span in chosen
                    )
                )
                != chosen
            ]
    return sets


def nested_spans(profile: StepProfile, spans: Sequence[SegmentSpan]) -> list[SegmentSpan]:
    """Each whole candidate among ``spans`` that holds others, recomputed with the whole
    candidates directly inside it recomputed again inside it (two-level checkpointing,
    :func:`~lightning_accudnn.planner.recompute.nested_span`): it holds what the candidate holds
    in forward, at a smaller transient in backward and more recompute time. Offered to the
    transient-aware search and to the smallest budget, where one level cannot reach a budget.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> profile = StepProfile(tuple(LayerProfile(f"l{i}", 100, 100) for i in range(4)), 0)
        >>> spans = [SegmentSpan("s", 0, 3, 10, 400, 4.0), SegmentSpan("s.b0", 0, 1, 10, 200, 1.0),
        ...          SegmentSpan("s.b1", 2, 3, 20, 200, 3.0)]
        >>> [(span.names, span.transient_bytes) for span in nested_spans(profile, spans)]
        [(('s', 's.b0', 's.b1'), 230)]
    """
    return list(_memo.get(profile, ("nested", tuple(spans)), lambda: _nested_spans(profile, spans)))


def _nested_spans(profile: StepProfile, spans: Sequence[SegmentSpan]) -> tuple[SegmentSpan, ...]:
    saved = [layer.saved_bytes for layer in profile.layers]
    nested = []
    for span in spans:
        if span.selective or span.inner:
            continue
        inner = inner_spans(span, spans)
        if inner:
            nested.append(nested_span(span, inner, saved))
    return tuple(nested)


def span_groups(spans: Sequence[SegmentSpan]) -> list[tuple[SegmentSpan, ...]]:
    """The groups of candidates whose sets are searched: all of them, and where whole and
    selective candidates mix (policy ``"auto"``), each kind alone too, so that ``auto`` searches
    every set that ``"recompute"`` and ``"selective"`` search.

    Example:
        >>> spans = [SegmentSpan("a", 0, 1, 0, 10, 1.0), SegmentSpan("a", 0, 1, 0, 10, 1.0, selective=True)]
        >>> [len(group) for group in span_groups(spans)]
        [2, 1, 1]
    """
    whole = tuple(span for span in spans if not span.selective)
    selective = tuple(span for span in spans if span.selective)
    if whole and selective:
        return [tuple(spans), whole, selective]
    return [tuple(spans)]


#: :func:`fitting_sets` asks for sets that leave these shares of the bytes the link can copy
#: behind the compute to be swapped...
SWAP_SHARES = (0.0, 0.125, 0.25, 0.5)
#: Larger shares (within the whole memory left) give sets that only the quick hidden-chain
#: plans judge (:func:`_search_many`): the full keep/swap search rarely hides that much.
CHAIN_SHARES = (0.625, 0.75, 0.875)
#: ...each within these shares of the memory left (the reduction may count a little low).
FIT_MARGINS = (1.0, 0.97)


def fitting_sets(
    profile: StepProfile,
    spans: Sequence[SegmentSpan],
    cap: int,
    swappable: bool = True,
    shares: Sequence[float] = SWAP_SHARES,
    margins: Sequence[float] = FIT_MARGINS,
) -> list[tuple[SegmentSpan, ...]]:
    """The cheapest recompute sets that fit ``cap`` with nothing swapped by the reduction of
    :func:`~lightning_accudnn.planner.frontier.fitting_set`, and (``swappable``) those that
    leave some bytes to swap: a share (each of ``shares``, by default :data:`SWAP_SHARES`) of
    what the link copies out during the forward and back during the backward, the copies the
    compute can hide. Working memory counts as the timeline counts it (none fits below the
    static memory and the working memory between the passes).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> profile = StepProfile(tuple(LayerProfile(f"l{i}", 100, 100, 1.0, 1.0) for i in range(4)), 0)
        >>> spans = [SegmentSpan("a", 0, 1, 10, 200, 1.0), SegmentSpan("b", 2, 3, 10, 200, 1.0)]
        >>> [[span.name for span in chosen] for chosen in fitting_sets(profile, spans, 320, False)]
        [['a']]
    """
    if cap < profile.static_bytes + profile.outside_working_bytes:
        return []  # not even the step between the passes fits
    saved = [layer.saved_bytes for layer in profile.layers]
    working = (
        [max(layer.forward_working_bytes, layer.backward_working_bytes) for layer in profile.layers]
        if profile.layers_have_working_bytes
        else None
    )
    available = cap - profile.static_bytes
    hidden = 0.0
    if swappable:
        forward = sum(layer.forward_seconds for layer in profile.layers)
        backward = sum(layer.backward_seconds for layer in profile.layers)
        hidden = min(
            float(profile.swappable_bytes),
            forward * profile.d2h_bytes_per_second,
            backward * profile.h2d_bytes_per_second,
        )
    sets: dict[tuple[tuple[str, bool], ...], tuple[SegmentSpan, ...]] = {}
    for share in shares if hidden > 0 else (0.0,):
        for margin in margins:
            chosen = fitting_set(
                spans, saved, int(margin * available + share * hidden), working_bytes=working
            )
            if chosen is not None:
                sets.setdefault(set_key(chosen), chosen)
    return list(sets.values())


def _copy_bound(profile: StepProfile, over: int) -> float:
    """A lower bound on the step of any plan of ``profile`` whose peak is ``over`` bytes below
    the peak with nothing swapped: that many bytes are copied out during the forward (the
    compute waits for a retired layer's copy) and back during the backward (a layer's backward
    waits for its bytes), so ``max(forward, over / d2h) + max(backward, over / h2d)``."""
    forward = sum(layer.forward_seconds for layer in profile.layers)
    backward = sum(layer.backward_seconds for layer in profile.layers)
    out, back = over / profile.d2h_bytes_per_second, over / profile.h2d_bytes_per_second
    return max(forward, out) + max(backward, back)


def _search_variants(
    profile: StepProfile, step: RecomputedProfile, simulator: Simulator
) -> list[tuple[RecomputedProfile, Simulator]]:
    """``step`` (with ``simulator``), and where it may swap recomputed segments' inputs, the same
    set with them kept: the keep/swap search is a heuristic that more layers to swap can lead
    astray, so each is searched and the faster plan kept."""
    segments = set(step.recomputed)
    if not any(layer.swappable_bytes for layer in step.profile.layers if layer.name in segments):
        return [(step, simulator)]
    kept = recomputed_profile(profile, step.spans, keep_inputs=True)
    return [(step, simulator), (kept, Simulator(kept.profile, kept.transient_bytes))]


def _on_profile(host_fits: HostFits, step: RecomputedProfile) -> Callable[[tuple[bool, ...]], bool]:
    """``host_fits`` (over the profile's layers, and the bytes of recomputed segments' inputs)
    for swap sets over the layers of ``step``."""
    size = sum(len(origin) for origin in step.origin)  # the groups partition the profile's layers
    segments = set(step.recomputed)

    def fits(swap: tuple[bool, ...]) -> bool:
        original = [False] * size
        inputs = 0
        for swapped, origin, layer in zip(swap, step.origin, step.profile.layers, strict=True):
            if not swapped:
                continue
            if layer.name in segments:
                inputs += layer.swappable_bytes
            else:
                original[origin[0]] = True
        return host_fits(tuple(original), inputs)

    return fits


def _least_peak(step: RecomputedProfile) -> int:
    simulator = Simulator(step.profile, step.transient_bytes)
    return simulator.peak_bytes(least_peak_choice(simulator))
