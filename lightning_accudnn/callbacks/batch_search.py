"""The batch-size search as plain functions over a throughput-measuring function.

Nothing here knows Lightning, devices or ranks: :func:`search_batch_size` is handed a
``measure(batch_size) -> Trial`` function (and optionally a ``predict`` function that says
which sizes fit and how fast they should run) and returns which size to train at. The
:class:`~lightning_accudnn.callbacks.EfficiencyTuner` supplies functions that run a few real
training steps and consult the swap planner; tests supply fake ones.

The rule: the highest *measured* samples per second wins, and among the sizes within
``tolerance`` of it the smallest is chosen (a smaller batch needs a smaller change of the
learning rate and usually generalises at least as well).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "NoBatchSizeFitsError",
    "Prediction",
    "SearchResult",
    "Trial",
    "candidate_batch_sizes",
    "choose_batch_size",
    "search_batch_size",
]


@dataclass(frozen=True)
class Trial:
    """What a few timed training steps at one batch size gave.

    ``samples_per_second`` is ``None`` when the trial failed; ``failure`` then says why
    (out of memory, over the budget). ``seconds_per_batch`` is the mean time of one
    training batch in the timed window; ``peak_bytes`` the measured peak device memory
    (``None`` where nothing measures it).

    Example:
        >>> Trial(64, samples_per_second=1000.0).ok
        True
        >>> Trial(128, failure="out of memory").ok
        False
    """

    batch_size: int
    samples_per_second: float | None = None
    seconds_per_batch: float | None = None
    peak_bytes: int | None = None
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.samples_per_second is not None


@dataclass(frozen=True)
class Prediction:
    """What the performance model expects at one batch size, before measuring it.

    ``feasible`` is false when no swap plan fits the budget (``reason`` says by how much);
    ``seconds_per_batch`` and ``peak_bytes`` are the model's figures for a feasible size.

    Example:
        >>> Prediction(64, feasible=True, seconds_per_batch=0.5).samples_per_second
        128.0
    """

    batch_size: int
    feasible: bool
    seconds_per_batch: float | None = None
    peak_bytes: int | None = None
    reason: str | None = None

    @property
    def samples_per_second(self) -> float | None:
        if not self.feasible or not self.seconds_per_batch:
            return None
        return self.batch_size / self.seconds_per_batch


@dataclass(frozen=True)
class SearchResult:
    """The chosen batch size and everything the search saw, in the order it saw it.

    Example:
        >>> result = search_batch_size([8, 16], lambda b: Trial(b, samples_per_second=float(b)))
        >>> result.chosen, [t.batch_size for t in result.trials]
        (16, [8, 16])
    """

    chosen: int
    trials: tuple[Trial, ...]
    tolerance: float
    predictions: Mapping[int, Prediction] = field(default_factory=dict)
    stopped_because: str = "no candidates left"

    @property
    def best(self) -> Trial:
        """The trial with the highest measured throughput."""
        return max((t for t in self.trials if t.ok), key=_throughput)

    @property
    def chosen_trial(self) -> Trial:
        return next(t for t in self.trials if t.ok and t.batch_size == self.chosen)


class NoBatchSizeFitsError(RuntimeError):
    """Even the smallest candidate batch size failed (out of memory or over the budget).

    Example:
        >>> try:
        ...     search_batch_size([8], lambda b: Trial(b, failure="out of memory"))
        ... except NoBatchSizeFitsError as error:
        ...     error.trial.batch_size
        8
    """

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        super().__init__(
            f"the smallest candidate batch size {trial.batch_size} did not run ({trial.failure}); "
            "lower min_batch_size, raise the memory budget, or give smaller batch_sizes"
        )


def candidate_batch_sizes(
    start: int, max_batch_size: int, growth: float = 2.0, limit: int | None = None
) -> list[int]:
    """``start``, ``start * growth``, ... up to ``max_batch_size`` (and ``limit``, e.g. the dataset).

    Example:
        >>> candidate_batch_sizes(24, 200)
        [24, 48, 96, 192]
        >>> candidate_batch_sizes(8, 1000, growth=4.0, limit=100)
        [8, 32]
    """
    if start < 1:
        raise ValueError(f"the smallest batch size must be >= 1, got {start}")
    if growth <= 1.0:
        raise ValueError(f"growth must be > 1, got {growth}")
    top = max_batch_size if limit is None else min(max_batch_size, limit)
    sizes: list[int] = []
    size = start
    while size <= top:
        sizes.append(size)
        size = max(size + 1, math.ceil(size * growth))
    return sizes


def choose_batch_size(trials: Sequence[Trial], tolerance: float) -> int:
    """The smallest batch size whose throughput is within ``tolerance`` of the best one.

    Example:
        >>> trials = [Trial(8, 100.0), Trial(16, 190.0), Trial(32, 200.0), Trial(64, 150.0)]
        >>> choose_batch_size(trials, tolerance=0.0), choose_batch_size(trials, tolerance=0.1)
        (32, 16)
    """
    _check_tolerance(tolerance)
    measured = [t for t in trials if t.ok]
    if not measured:
        raise ValueError("no trial succeeded: nothing to choose from")
    best = max(measured, key=_throughput)
    threshold = (1.0 - tolerance) * _throughput(best)
    return min(t.batch_size for t in measured if _throughput(t) >= threshold)


def search_batch_size(
    candidates: Sequence[int],
    measure: Callable[[int], Trial],
    *,
    max_trials: int = 8,
    tolerance: float = 0.05,
    predict: Callable[[Trial, Sequence[int]], Mapping[int, Prediction]] | None = None,
) -> SearchResult:
    """Measure candidates from the smallest up and choose by :func:`choose_batch_size`.

    The smallest candidate is measured first; if it fails, :class:`NoBatchSizeFitsError`.
    ``predict(first_trial, other_sizes)``, when given, is then asked once about the other
    sizes: the sizes it calls infeasible are never run, and sizes it adds (such as the
    largest one the budget fits) join the candidates. The rest are measured in increasing
    order; the search stops at the first failure (a larger batch would fail too), at the
    first throughput more than ``tolerance`` below the best so far (past the peak), or
    after ``max_trials`` measurements in all.

    Example:
        >>> curve = {8: 100.0, 16: 180.0, 32: 200.0, 64: 120.0, 128: 90.0}
        >>> result = search_batch_size(sorted(curve), lambda b: Trial(b, curve[b]), tolerance=0.05)
        >>> result.chosen, [t.batch_size for t in result.trials]  # 128 never runs: past the peak
        (32, [8, 16, 32, 64])
    """
    if max_trials < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    _check_tolerance(tolerance)
    sizes = sorted(set(candidates))
    if not sizes:
        raise ValueError("no candidate batch sizes")
    if sizes[0] < 1:
        raise ValueError(f"batch sizes must be >= 1, got {sizes[0]}")

    first = measure(sizes[0])
    trials = [first]
    if not first.ok:
        raise NoBatchSizeFitsError(first)
    rest = sizes[1:]
    predictions: dict[int, Prediction] = {}
    if predict is not None and rest:
        predictions = dict(predict(first, rest))
        proposed = {b for b in predictions if b > sizes[0]}
        rest = [b for b in sorted(set(rest) | proposed) if b not in predictions or predictions[b].feasible]

    stopped = "no candidates left"
    for size in rest:
        if len(trials) >= max_trials:
            stopped = f"max_trials={max_trials} reached"
            break
        trial = measure(size)
        trials.append(trial)
        if not trial.ok:
            stopped = f"batch size {size} failed ({trial.failure})"
            break
        best = max((t for t in trials if t.ok), key=_throughput)
        if _throughput(trial) < (1.0 - tolerance) * _throughput(best):
            stopped = f"batch size {size} is past the peak"
            break
    return SearchResult(
        chosen=choose_batch_size(trials, tolerance),
        trials=tuple(trials),
        tolerance=tolerance,
        predictions=predictions,
        stopped_because=stopped,
    )


def _throughput(trial: Trial) -> float:
    assert trial.samples_per_second is not None
    return trial.samples_per_second


def _check_tolerance(tolerance: float) -> None:
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
