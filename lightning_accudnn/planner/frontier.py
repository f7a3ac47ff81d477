"""Which segments to recompute: the cheapest sets for each amount of memory freed.

A recompute set is judged by the two-stream simulator, but there are too many sets to
simulate (ResNet-152 has 55 candidates, nested: a stage and its blocks). The search reduces
each candidate to two numbers, the bytes it frees at the end of the forward and the forward
seconds it runs again in backward, and asks for the *frontier*: for each amount of bytes freed,
the set of non-overlapping candidates that frees at least that much for the least recompute
time. A swap plan then removes what recomputation leaves over the budget, at a cost that grows
with the bytes left, so the fastest plan recomputes a frontier set (up to the reduction's
error, which the simulator, judging every set searched, does not share).

The frontier is a knapsack over intervals: a dynamic program over the forward order. Position
``j`` has, per amount ``q`` (bytes in units of ``total / resolution``, rounded down, so an
amount counted is never more than freed), the least seconds of a set of candidates lying wholly
before layer ``j``; a candidate ``[first, last]`` moves from ``first`` to ``last + 1`` adding its
amount and seconds, skipping layer ``j`` moves to ``j + 1`` unchanged. Nested candidates (a
stage and its blocks) overlap, so a set never holds both. It is exact for the rounded amounts,
in ``O(candidates * resolution)``: only the candidates' boundaries are positions.

Example:
    >>> from lightning_accudnn.planner.recompute import SegmentSpan, set_key
    >>> spans = [SegmentSpan("stage", 0, 3, 10, 410, 4.0), SegmentSpan("stage.b0", 0, 1, 10, 210, 1.0),
    ...          SegmentSpan("stage.b1", 2, 3, 10, 200, 3.5)]
    >>> [[span.name for span in chosen] for chosen in recompute_frontier(spans, 4, resolution=8)]
    [[], ['stage.b0'], ['stage']]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from lightning_accudnn.planner.recompute import SegmentSpan, set_key

__all__ = [
    "DEFAULT_RESOLUTION",
    "FITTING_RESOLUTION",
    "FreedBytes",
    "fitting_set",
    "freed_bytes",
    "recompute_cost_lines",
    "recompute_frontier",
]

#: Amounts of bytes freed the frontier tells apart (its step: the most freed / this).
DEFAULT_RESOLUTION = 128


def freed_bytes(span: SegmentSpan, *, outputs_counted_again: bool = True) -> int:
    """What recomputing ``span`` frees at the end of the forward, by the reduction: what it
    saves less what it holds to its backward (its inputs and, selective, its kept bytes) and,
    unless the profile lists re-saves, its outputs (counted again after it, see
    :mod:`.recompute`); never below 0.

    Example:
        >>> freed_bytes(SegmentSpan("b", 0, 1, 10, 100, 1.0, output_bytes=20))
        70
    """
    outputs = span.output_bytes if outputs_counted_again else 0
    return max(0, span.freed_bytes - outputs)


def recompute_frontier(
    spans: Sequence[SegmentSpan],
    layers: int,
    *,
    resolution: int = DEFAULT_RESOLUTION,
    outputs_counted_again: bool = True,
) -> list[tuple[SegmentSpan, ...]]:
    """The cheapest non-overlapping set of ``spans`` (over ``layers`` profile layers) for each
    amount of bytes freed, from nothing to the most any set frees, distinct sets in order of
    bytes freed (each in forward order). See the module docstring."""
    useful = [span for span in spans if freed_bytes(span, outputs_counted_again=outputs_counted_again) > 0]
    if not useful:
        return [()]
    total = _most_freed(useful, layers, outputs_counted_again)
    unit = max(1, math.ceil(total / resolution))
    amounts = [freed_bytes(span, outputs_counted_again=outputs_counted_again) // unit for span in useful]
    top = max(1, total // unit)
    # Only the candidates' boundaries matter: positions are their first layers and the layers
    # after their last, in forward order.
    points = sorted({0, layers, *(span.first for span in useful), *(span.last + 1 for span in useful)})
    at = {point: p for p, point in enumerate(points)}
    starting: list[list[int]] = [[] for _ in points]
    for index, span in enumerate(useful):
        starting[at[span.first]].append(index)
    inf = math.inf
    # cost[p][q]: least seconds of a set before points[p] freeing at least q units;
    # back[p][q]: how it was reached, (amount before, candidate or -1 for the previous point).
    cost = [[inf] * (top + 1) for _ in points]
    back: list[list[tuple[int, int]]] = [[(0, -1)] * (top + 1) for _ in points]
    cost[0][0] = 0.0
    for p in range(len(points)):
        here, here_back = cost[p], back[p]
        if p > 0:  # the layers since the previous point are not recomputed
            before = cost[p - 1]
            for q in range(top + 1):  # on a tie, recompute nothing more
                if before[q] <= here[q] and before[q] < inf:
                    here[q], here_back[q] = before[q], (q, -1)
        for q in range(top - 1, -1, -1):  # a set freeing q + 1 units frees q units too
            if here[q + 1] < here[q]:
                here[q], here_back[q] = here[q + 1], here_back[q + 1]
        for index in starting[p]:
            span, amount = useful[index], amounts[index]
            end = at[span.last + 1]
            target, target_back = cost[end], back[end]
            seconds = span.recompute_seconds
            for q in range(top + 1):
                value = here[q]
                if value == inf:  # nothing before frees q units: nothing to extend
                    continue
                value += seconds
                reached = q + amount
                if reached > top:
                    reached = top
                if value < target[reached]:
                    target[reached], target_back[reached] = value, (q, index)
    sets: list[tuple[SegmentSpan, ...]] = []
    seen: set[tuple[tuple[str, bool], ...]] = set()
    last = len(points) - 1
    for q in range(top + 1):
        if cost[last][q] == inf:
            break
        chosen: list[SegmentSpan] = []
        p, amount_left = last, q
        while p > 0 or amount_left > 0:
            amount_left, index = back[p][amount_left]
            if index < 0:
                p -= 1
            else:
                chosen.append(useful[index])
                p = at[useful[index].first]
            if p == 0 and amount_left == 0:
                break
        names = set_key(tuple(reversed(chosen)))
        if names not in seen:
            seen.add(names)
            sets.append(tuple(reversed(chosen)))
    return sets


def _most_freed(spans: Sequence[SegmentSpan], layers: int, outputs_counted_again: bool) -> int:
    """The most bytes any non-overlapping set of ``spans`` frees (an interval scheduling DP)."""
    best = [0] * (layers + 1)
    ending: list[list[SegmentSpan]] = [[] for _ in range(layers)]
    for span in spans:
        ending[span.last].append(span)
    for j in range(layers):
        best[j + 1] = best[j]
        for span in ending[j]:
            freed = freed_bytes(span, outputs_counted_again=outputs_counted_again)
            best[j + 1] = max(best[j + 1], best[span.first] + freed)
    return best[layers]


#: What a bound on freed bytes says recomputing a span frees, given the recomputed span just
#: before it (``before``, ``None`` when the layer before it is kept or it starts the step):
#: ``freed(before, span)``; ``freed(before, None)`` is what ``before`` leaves to the kept layers
#: after it (0 or less). :func:`recompute_cost_lines` sums it over a set's spans and gaps.
FreedBytes = Callable[[SegmentSpan | None, SegmentSpan | None], int]


def _own_freed(before: SegmentSpan | None, span: SegmentSpan | None) -> int:
    """Each span's own :attr:`~.recompute.SegmentSpan.freed_bytes`, whatever lies around it."""
    return 0 if span is None else span.freed_bytes


def recompute_cost_lines(
    spans: Sequence[SegmentSpan], freed: FreedBytes | None = None
) -> tuple[tuple[tuple[float, float], ...], int]:
    """Lines whose maximum bounds from below the least forward seconds of a non-overlapping set
    of ``spans`` that frees at least ``y`` bytes, and the most bytes any such set frees (beyond
    it, no set does). A set frees what ``freed`` says (:data:`FreedBytes`) summed over its
    spans, each given the span just before it, and over the kept gaps after a span; by default
    each span's own ``SegmentSpan.freed_bytes`` (spans freeing nothing are left out then). For
    a bound on the step, ``freed`` must be at least what a set really frees, for every set.

    Each line ``(l, c)`` is a Lagrangian bound: for ``l >= 0`` and any set ``S`` freeing at
    least ``y``, ``seconds(S) >= l * y + seconds(S) - l * freed(S) >= l * y + c``, ``c`` being
    the least of ``seconds - l * freed`` over every non-overlapping set (a dynamic program over
    the forward order whose state is the span just before). The values of ``l`` are the
    breakpoints of that least (found by bisecting between the sets it picks, up to the set
    freeing the most), so the maximum is the linear relaxation of choosing the set, a stage never
    with its blocks; without that constraint (the fractional knapsack) it can only be lower. It
    is convex and non-decreasing in ``y``.

    Example:
        >>> spans = [SegmentSpan("s", 0, 1, 0, 100, 2.0), SegmentSpan("s.b", 0, 0, 0, 60, 1.0)]
        >>> lines, most = recompute_cost_lines(spans)
        >>> most, round(max(slope * 80 + intercept for slope, intercept in lines), 9)
        (100, 1.5)
    """
    useful = list(spans) if freed is not None else [span for span in spans if span.freed_bytes > 0]
    if not useful:
        return ((0.0, 0.0),), 0
    figure = freed if freed is not None else _own_freed
    points = sorted({span.first for span in useful} | {span.last + 1 for span in useful})
    at = {point: p for p, point in enumerate(points)}
    starting: list[list[int]] = [[] for _ in points]
    for index, span in enumerate(useful):
        starting[at[span.first]].append(index)
    # What each step of a set frees: a span after the span just before it (-1: kept layers or
    # the start), kept layers after a span; only spans ending where another starts are asked.
    ending_at = {point: [i for i, span in enumerate(useful) if span.last + 1 == point] for point in points}
    gains = {
        (previous, index): figure(useful[previous] if previous >= 0 else None, useful[index])
        for index, span in enumerate(useful)
        for previous in (-1, *ending_at[span.first])
    }
    closes = [figure(span, None) for span in useful]
    # per point: (span, the point after it, its recompute seconds) of the spans starting there
    taking = [
        [(index, at[useful[index].last + 1], useful[index].recompute_seconds) for index in row]
        for row in starting
    ]

    def schedule(slope: float) -> tuple[int, float]:
        """(bytes freed, seconds) of a non-overlapping set with the least ``seconds - slope *
        freed`` (on a tie, the one freeing more)."""
        # per point: span just before (-1: kept) -> (seconds - slope * freed, -freed, seconds)
        states: list[dict[int, tuple[float, int, float]]] = [{} for _ in points]
        states[0][-1] = (0.0, 0, 0.0)
        final = (math.inf, 0, 0.0)
        last = len(points) - 1
        for p, here in enumerate(states):
            for previous, (value, minus_freed, seconds) in here.items():
                close = closes[previous] if previous >= 0 else 0
                kept = (value - slope * close, minus_freed - close, seconds)
                if p < last:  # the layers up to the next point are kept
                    known = states[p + 1].get(-1)
                    if known is None or kept[:2] < known[:2]:
                        states[p + 1][-1] = kept
                elif kept[:2] < final[:2]:
                    final = kept
                for index, end, cost in taking[p]:
                    gain = gains[(previous, index)]
                    option = (value - slope * gain + cost, minus_freed - gain, seconds + cost)
                    known = states[end].get(index)
                    if known is None or option[:2] < known[:2]:
                        states[end][index] = option
        return -final[1], final[2]

    top = sum(span.recompute_seconds for span in useful) + 1.0  # a byte more outweighs every second
    low, high = schedule(0.0), schedule(top)
    slopes = {0.0, top}

    def explore(first: tuple[int, float], last: tuple[int, float], depth: int) -> None:
        if last[0] <= first[0] or depth > 64:
            return
        slope = (last[1] - first[1]) / (last[0] - first[0])
        if slope <= 0:
            return
        slopes.add(slope)
        middle = schedule(slope)
        if middle[1] - slope * middle[0] < first[1] - slope * first[0] - 1e-12 * (1 + abs(first[1])):
            explore(first, middle, depth + 1)
            explore(middle, last, depth + 1)

    explore(low, high, 0)
    slopes.discard(top)  # it only bounds within a byte of the most; its intercept would round
    lines = []
    for slope in sorted(slopes):
        freed_here, seconds = schedule(slope)
        # Lowered by a few units in the last place, so a line evaluated in floating point at any
        # amount up to the most never lies above the exact line.
        margin = 1e-15 * (slope * max(high[0], abs(freed_here)) + abs(seconds))
        lines.append((slope, seconds - slope * freed_here - margin))
    return tuple(lines), high[0]


# A state of fitting_set's program: held bytes, seconds, the order its key was first reached
# in (ties in held bytes and seconds keep that order), the span just before (-1: none), its
# bucket, the state it came from (its number in the trail, -1: the start) and the span taken to
# it (-1: none). Numbers only: the garbage collector stops tracking such tuples, so the many
# states of a large profile never make it walk the whole heap of a training process.
_State = tuple[int, float, int, int, int, int, int]

#: Amounts of held bytes :func:`fitting_set` tells apart (its step: the bytes available / this).
FITTING_RESOLUTION = 512


def fitting_set(
    spans: Sequence[SegmentSpan],
    saved_bytes: Sequence[int],
    available_bytes: int,
    *,
    working_bytes: Sequence[int] | None = None,
    resolution: int = FITTING_RESOLUTION,
) -> tuple[SegmentSpan, ...] | None:
    """The non-overlapping set of ``spans`` with the least recompute seconds whose step, with
    nothing swapped, holds at most ``available_bytes`` of activations at every moment, by a
    reduction of the timeline's memory (``None`` if no set does; ``saved_bytes`` per profile
    layer).

    The reduction: walking the forward order, a kept layer holds its saved bytes; a recomputed
    span holds its :attr:`~.recompute.SegmentSpan.held_bytes` (less the inputs an earlier kept
    layer saves, ``input_sources``, when the layer before it is kept), and its outputs are held
    once more by what follows unless the next span takes them as inputs. Everything held before
    a recomputed span's backward plus its saves rebuilt then (its transient) must fit, and so
    must everything held at the end of the forward. Unlike :func:`recompute_frontier`, where a
    span lies matters: a stage early in the forward rebuilds its saves while little else is held.
    ``working_bytes`` (per profile layer, default none) is the working memory of each layer, the
    larger of its ``forward_working_bytes`` and ``backward_working_bytes``: a kept layer's must
    fit on top of what is held up to it (in forward and in backward), and a recomputed span's
    largest on top of its transient, as the timeline counts them (:mod:`.recompute`).

    A dynamic program over the forward order whose state is the bytes held so far (in units of
    ``available_bytes / resolution``; each state keeps the exact bytes of its cheapest set) and
    the span just before (whose outputs may be the next one's inputs). The timeline judges the
    set it gives.

    Example:
        >>> spans = [SegmentSpan("a", 0, 1, 10, 200, 1.0), SegmentSpan("b", 2, 3, 10, 200, 1.0)]
        >>> [span.name for span in fitting_set(spans, [100] * 4, 320)]  # b's transient too large
        ['a']
        >>> fitting_set(spans, [100] * 4, 200) is None
        True
    """
    layers = len(saved_bytes)
    useful = [span for span in spans if span.freed_bytes > 0]
    prefix = [0]
    for nbytes in saved_bytes:
        prefix.append(prefix[-1] + nbytes)
    points = sorted({0, layers, *(span.first for span in useful), *(span.last + 1 for span in useful)})
    at = {point: p for p, point in enumerate(points)}
    starting: list[list[int]] = [[] for _ in points]
    for index, span in enumerate(useful):
        starting[at[span.first]].append(index)
    # What the layers up to the next point need on top of what is held before them when kept:
    # their saves up to each, plus its working memory (their saves alone without any).
    needs = []
    for p in range(len(points) - 1):
        first, end = points[p], points[p + 1]
        need = prefix[end] - prefix[first]
        if working_bytes is not None:
            for j in range(first, end):
                need = max(need, prefix[j + 1] - prefix[first] + working_bytes[j])
        needs.append(need)
    rebuilding = [
        max(working_bytes[span.first : span.last + 1], default=0) if working_bytes is not None else 0
        for span in useful
    ]
    unit = max(1, available_bytes // resolution)
    # states[p][previous span or -1][bucket]: the cheapest state reaching it (see _State)
    states: list[dict[int, dict[int, _State]]] = [{} for _ in points]
    states[0][-1] = {0: (0, 0.0, 0, -1, 0, -1, -1)}
    reached = 1  # keys reached so far: the order of the next new one
    # The states that went on, by number: the state each came from and the span taken to it.
    trail_from: list[int] = []
    trail_taken: list[int] = []
    # What the layers up to the next point add when kept after each previous span: its outputs
    # (the last entry, for -1: none).
    outputs = [*(span.output_bytes for span in useful), 0]
    inf = math.inf
    for p in range(len(points) - 1):
        gap = prefix[points[p + 1]] - prefix[points[p]]
        need = needs[p]
        kept = states[p + 1].setdefault(-1, {})
        here = starting[p]
        # per previous span (the last entry: -1), the offers of the spans starting here
        offers: list[list[tuple[int, dict[int, _State], int, int, float]] | None] = [None] * len(outputs)
        # Only states no other with the same previous span beats in both bytes held and seconds
        # go on (the others can only lead to sets no cheaper and no smaller); the walk is in
        # order of bytes held, then seconds, then of first reaching (a tie keeps the earlier).
        least = [inf] * len(outputs)  # per previous span (the last entry: -1)
        walk = [state for by_bucket in states[p].values() for state in by_bucket.values()]
        walk.sort()
        for held, seconds, _, previous, _, came_from, taken in walk:
            if seconds >= least[previous]:
                continue
            least[previous] = seconds
            number = len(trail_from)
            trail_from.append(came_from)
            trail_taken.append(taken)
            # The layers up to the next point are kept.
            now = held + gap + outputs[previous]
            if now - gap + need <= available_bytes:
                bucket = now // unit
                known = kept.get(bucket)
                if known is None:
                    kept[bucket] = (now, seconds, reached, -1, bucket, number, -1)
                    reached += 1
                elif seconds < known[1] or (seconds == known[1] and now < known[0]):
                    kept[bucket] = (now, seconds, known[2], -1, bucket, number, -1)
            if not here:
                continue
            options = offers[previous]
            if options is None:
                options = _offers(useful, here, previous, states, at, available_bytes, rebuilding)
                offers[previous] = options
            for index, target, added, most_held, span_seconds in options:
                if held > most_held:  # its transient (never negative) would not fit
                    continue
                now = held + added
                bucket = now // unit
                total = seconds + span_seconds
                known = target.get(bucket)
                if known is None:
                    target[bucket] = (now, total, reached, index, bucket, number, index)
                    reached += 1
                elif total < known[1] or (total == known[1] and now < known[0]):
                    target[bucket] = (now, total, known[2], index, bucket, number, index)
    final = [state for by_bucket in states[-1].values() for state in by_bucket.values()]
    if not final:
        return None
    last = min(final, key=lambda state: (state[1], state[0], state[3], state[4]))
    chosen: list[SegmentSpan] = []
    came_from, taken = last[5], last[6]
    while True:
        if taken >= 0:
            chosen.append(useful[taken])
        if came_from < 0:
            break
        came_from, taken = trail_from[came_from], trail_taken[came_from]
    return tuple(reversed(chosen))


def _offers(
    useful: Sequence[SegmentSpan],
    here: Sequence[int],
    previous: int,
    states: list[dict[int, dict[int, _State]]],
    at: dict[int, int],
    available_bytes: int,
    rebuilding: Sequence[int],
) -> list[tuple[int, dict[int, _State], int, int, float]]:
    """For each span starting at a point, taken after ``previous`` (-1: a kept layer or the
    start): (span, the states at its end that it is the last span of, by bucket, the bytes it
    adds to those held, the most bytes held before it with which it and its transient fit, its
    recompute seconds). A recomputed span
    holds its :attr:`~.recompute.SegmentSpan.held_bytes`; after a recomputed span, that one's
    outputs once more unless this one takes them as inputs; after kept layers, less the inputs
    they saved (``input_sources``). ``rebuilding`` is each span's working memory on top of its
    transient."""
    before = useful[previous] if previous >= 0 else None
    options = []
    for index in here:
        span = useful[index]
        if before is not None:
            added = max(0, before.output_bytes - span.sources.get(before.name, 0)) + span.held_bytes
        else:
            added = span.held_bytes - min(span.input_bytes, sum(nbytes for _, nbytes in span.input_sources))
        transient = span.saved_bytes if span.rebuilt_bytes is None else span.rebuilt_bytes
        end = states[at[span.last + 1]].setdefault(index, {})
        most_held = available_bytes - transient - rebuilding[index] - added
        options.append((index, end, added, most_held, span.recompute_seconds))
    return options
