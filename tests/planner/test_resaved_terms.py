"""The simulator's backward terms with re-saved storages equal their direct definition.

The storage admitted alone is bounded by the largest record of the layers it may come from.

``Simulator._backward_terms_resaved`` finds, for each layer, the nearest layer below it with
bytes to bring back by one pass over the positions whose content does not depend on the
layer; the reference below scans down from every layer, as the definition reads (and as the
simulator did before: quadratic in the number of layers). Random profiles, both compared.
"""

import random

import pytest

from lightning_accudnn.planner.timeline import Simulator


def _direct_terms(sim, retired):
    held = [{} for _ in range(sim.k)]
    arrivals = [[] for _ in range(sim.k)]
    for first, entries in enumerate(sim.resaved):
        if not entries or retired[first] == 0:
            continue
        for i in range(first + 1, max(last for last, _ in entries) + 1):
            held[first][i] = min(retired[first], sum(nbytes for last, nbytes in entries if last >= i))
        for last in {last for last, _ in entries}:
            arrivals[last].append((first, sum(nbytes for other, nbytes in entries if other == last)))
    terms = []
    kept_below, retired_below = sim.static, 0
    for i in range(sim.k):
        kept_below += sim.saved[i] - retired[i]
        retired_below += retired[i]
        early = sum(held[first].get(i, 0) for first in range(sim.k))

        def left_at(n, i=i):  # what is left at n to bring back while B_i runs
            arriving = sum(min(retired[f] - held[f].get(i, 0), moved) for f, moved in arrivals[n])
            return retired[n] - held[n].get(i, 0) + arriving

        def alone_at(n, i=i):  # the largest record at n the engine may bring back alone
            own = sim._largest[n] if retired[n] - held[n].get(i, 0) > 0 else 0
            arriving = [
                sim._largest[f]
                for f, moved in arrivals[n]
                if retired[f] - held[f].get(i, 0) > 0 and moved > 0
            ]
            return max([own, *arriving])

        below = ((left_at(n), n) for n in reversed(range(i)))
        next_retired = next((min(content, alone_at(n)) for content, n in below if content > 0), 0)
        extra = sim.transient[i] + sim.backward_working[i]
        terms.append((kept_below + extra, retired[i] + early, next_retired, retired_below, early))
    return terms


def _random_case(rng, k, resave_share):
    resaved = tuple(
        tuple((rng.randint(first + 1, k - 1), rng.randint(1, 30)) for _ in range(rng.randint(1, 3)))
        if first < k - 1 and rng.random() < resave_share
        else ()
        for first in range(k)
    )
    # A simulator of these figures (their consistency with a profile does not matter here).
    sim = object.__new__(Simulator)
    sim.k, sim.static, sim.resaved = k, rng.randint(0, 100), resaved
    sim.saved = [rng.randint(0, 50) for _ in range(k)]
    sim.transient = [rng.randint(0, 20) for _ in range(k)]
    sim.backward_working = [rng.choice([0, rng.randint(0, 20)]) for _ in range(k)]
    sim._backward_extra = [t + w for t, w in zip(sim.transient, sim.backward_working, strict=True)]
    sim._index_resaves()
    # Each layer's largest record: its whole bytes, or less (records listed).
    sim._largest = tuple(rng.choice([1000, rng.randint(1, 60)]) for _ in range(k))
    retired = [rng.choice([0, 0, rng.randint(0, 60)]) for _ in range(k)]
    return sim, retired


@pytest.mark.parametrize("resave_share", [0.1, 0.4, 0.9])
def test_resaved_terms_equal_the_direct_scan(resave_share):
    rng = random.Random(int(resave_share * 10))
    for _ in range(150):
        sim, retired = _random_case(rng, rng.randint(1, 60), resave_share)
        assert sim._backward_terms_resaved(retired) == _direct_terms(sim, retired)


def test_resaved_terms_with_no_resaved_layer_retired_equal_the_direct_scan():
    """Nothing re-saved is retired: the terms are those without re-saves (a shortcut)."""
    rng = random.Random(7)
    for _ in range(100):
        sim, retired = _random_case(rng, rng.randint(1, 60), 0.5)
        retired = [0 if sim.resaved[i] else nbytes for i, nbytes in enumerate(retired)]
        assert sim._backward_terms_resaved(retired) == _direct_terms(sim, retired)
