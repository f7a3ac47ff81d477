"""The search functions over fake throughput curves: best size, tolerance, bound, failures."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_accudnn.callbacks import (
    NoBatchSizeFitsError,
    Prediction,
    Trial,
    candidate_batch_sizes,
    choose_batch_size,
    search_batch_size,
)


class Curve:
    """A fake ``measure``: throughput from a table, failures above ``fails_from``; counts calls."""

    def __init__(self, rates: dict[int, float], fails_from: int | None = None) -> None:
        self.rates = rates
        self.fails_from = fails_from
        self.calls: list[int] = []

    def __call__(self, batch_size: int) -> Trial:
        self.calls.append(batch_size)
        if self.fails_from is not None and batch_size >= self.fails_from:
            return Trial(batch_size, failure="out of memory")
        return Trial(batch_size, samples_per_second=self.rates[batch_size], seconds_per_batch=0.1)


PEAK_AT_32 = {4: 40.0, 8: 75.0, 16: 140.0, 32: 200.0, 64: 150.0, 128: 90.0}


def test_the_highest_measured_throughput_wins():
    curve = Curve(PEAK_AT_32)
    result = search_batch_size(sorted(PEAK_AT_32), curve, tolerance=0.0)
    assert result.chosen == 32
    assert result.best.batch_size == 32
    assert curve.calls == [4, 8, 16, 32, 64]  # 128 never runs: 64 is past the peak
    assert "past the peak" in result.stopped_because


def test_among_sizes_within_the_tolerance_the_smallest_wins():
    rates = {8: 100.0, 16: 190.0, 32: 200.0, 64: 199.0}
    assert search_batch_size(sorted(rates), Curve(rates), tolerance=0.0).chosen == 32
    assert search_batch_size(sorted(rates), Curve(rates), tolerance=0.06).chosen == 16
    assert search_batch_size(sorted(rates), Curve(rates), tolerance=0.5).chosen == 8
    assert choose_batch_size([Trial(8, 100.0), Trial(16, failure="oom")], tolerance=0.1) == 8


@pytest.mark.parametrize("max_trials", [1, 2, 3])
def test_the_search_runs_at_most_max_trials(max_trials):
    rates = {2**i: float(2**i) for i in range(10)}  # always faster: only the bound stops it
    curve = Curve(rates)
    result = search_batch_size(sorted(rates), curve, max_trials=max_trials)
    assert len(curve.calls) == max_trials == len(result.trials)
    assert result.chosen == 2 ** (max_trials - 1)


def test_a_failed_size_ends_the_ladder_and_is_never_chosen():
    curve = Curve({8: 10.0, 16: 20.0, 32: 30.0, 64: 40.0}, fails_from=32)
    result = search_batch_size([8, 16, 32, 64], curve)
    assert curve.calls == [8, 16, 32]
    assert result.chosen == 16
    assert result.trials[-1].failure == "out of memory"


def test_when_the_smallest_size_fails_the_error_names_the_fix():
    with pytest.raises(NoBatchSizeFitsError, match="lower min_batch_size, raise the memory budget"):
        search_batch_size([8, 16], Curve({}, fails_from=1))


def test_predictions_skip_infeasible_sizes_and_may_add_one():
    curve = Curve({8: 10.0, 16: 20.0, 24: 25.0, 32: 30.0, 64: 40.0})
    seen = []

    def predict(first, sizes):
        seen.append((first.batch_size, list(sizes)))
        return {
            16: Prediction(16, feasible=True, seconds_per_batch=0.5),
            24: Prediction(24, feasible=True, seconds_per_batch=0.6),  # the largest that fits
            32: Prediction(32, feasible=False, reason="needs more"),
            64: Prediction(64, feasible=False, reason="needs more"),
        }

    result = search_batch_size([8, 16, 32, 64], curve, predict=predict)
    assert seen == [(8, [16, 32, 64])]
    assert curve.calls == [8, 16, 24]
    assert result.chosen == 24
    assert not result.predictions[32].feasible


def test_candidate_ladder():
    assert candidate_batch_sizes(4, 64) == [4, 8, 16, 32, 64]
    assert candidate_batch_sizes(3, 30, growth=1.5) == [3, 5, 8, 12, 18, 27]
    assert candidate_batch_sizes(16, 1000, limit=100) == [16, 32, 64]
    with pytest.raises(ValueError, match="growth"):
        candidate_batch_sizes(4, 64, growth=1.0)


@settings(max_examples=200, deadline=None)
@given(
    rates=st.lists(st.floats(min_value=1.0, max_value=1e4), min_size=1, max_size=9),
    max_trials=st.integers(min_value=1, max_value=9),
    tolerance=st.floats(min_value=0.0, max_value=0.9),
    fails_from=st.one_of(st.none(), st.integers(min_value=1, max_value=9)),
)
def test_search_invariants(rates, max_trials, tolerance, fails_from):
    table = {2**i: rate for i, rate in enumerate(rates)}
    curve = Curve(table, fails_from=None if fails_from is None else 2**fails_from)
    result = search_batch_size(sorted(table), curve, max_trials=max_trials, tolerance=tolerance)
    assert len(curve.calls) <= max_trials
    assert curve.calls == sorted(curve.calls)
    measured = [t for t in result.trials if t.ok]
    best = max(t.samples_per_second for t in measured)
    chosen = result.chosen_trial
    assert chosen.samples_per_second >= (1 - tolerance) * best
    assert all(
        t.samples_per_second < (1 - tolerance) * best for t in measured if t.batch_size < chosen.batch_size
    )
