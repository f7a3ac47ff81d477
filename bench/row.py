"""One result row of a benchmark run: what one strategy measured on one workload.

A row has every field; ``None`` where nothing was measured (a failed run, a figure that
does not apply). ``bench/README.md`` says what each field means.

Example:
    >>> row = ResultRow(name="oracle", strategy="oracle")
    >>> row.status, row.peak_allocated_bytes
    ('not run', None)
    >>> data = row.as_dict()
    >>> list(data)[:3], set(ROW_FIELDS) <= set(data)
    (['name', 'strategy', 'params'], True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class ResultRow:
    """The figures of one strategy's run, filled in as the run goes (see ``bench/README.md``)."""

    name: str
    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    status: str = "not run"
    error_type: str | None = None
    error: str | None = None
    budget_bytes: int | None = None
    #: Model state (parameters, gradients, buffers, optimizer state) when the row started.
    static_bytes: int | None = None
    warmup_steps: int | None = None
    measured_steps: int = 0
    steps_completed: int = 0
    peak_source: str | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    warmup_peak_allocated_bytes: int | None = None
    rss_peak_delta_bytes: int | None = None
    ledger_peak_bytes: int | None = None
    peak_reduction: float | None = None
    median_step_seconds: float | None = None
    median_fwd_bwd_seconds: float | None = None
    #: The host's time to issue forward and backward (no synchronisation): near
    #: ``median_fwd_bwd_seconds``, the device waited for the host.
    median_fwd_bwd_issue_seconds: float | None = None
    median_optimizer_seconds: float | None = None
    #: CUDA: the caching allocator's counters' increase per measured step, on average
    #: (``bench.measure.ALLOCATOR_COUNTERS``: retries under the cap, ``cudaMalloc`` and ``cudaFree``
    #: calls, synchronisations of every stream), each of which holds the host.
    allocator_calls_per_step: dict[str, float] | None = None
    #: AccUDNN rows: the host's time per step in the engine's work for its swapped storages
    #: (their count times the seconds per storage the session measured): against the host ms,
    #: how much of the host's issue time the engine's swaps take.
    engine_host_seconds: float | None = None
    samples_per_second: float | None = None
    step_seconds: list[float] | None = None
    bytes_swapped_out: int | None = None
    bytes_swapped_in: int | None = None
    wait_seconds: float | None = None
    lower_bound_seconds: float | None = None
    bound_ratio: float | None = None
    lower_bound_source: str | None = None
    predicted_peak_bytes: int | None = None
    predicted_step_seconds: float | None = None
    engine_step_seconds: float | None = None
    #: AccUDNN rows: the session's forward and backward of ``engine_step_seconds`` (medians), to
    #: set against the plan's ``predicted_forward_seconds`` and the rest of its step.
    engine_forward_seconds: float | None = None
    engine_backward_seconds: float | None = None
    engine_peak_bytes: int | None = None
    peak_vs_predicted: float | None = None
    time_vs_predicted: float | None = None
    profiling_steps_measured: int | None = None
    #: lightning-accudnn: steps (warm-up included) whose pass, replayed, departed from its sequence.
    graph_changed_steps: int | None = None
    replans_during_measurement: int | None = None
    plan: dict[str, Any] | None = None
    #: Where one more step's time went on the device, stream by stream (CUDA only: one step after
    #: the measured ones under ``torch.profiler``, :class:`bench.streams.StreamBreakdown`).
    streams: dict[str, Any] | None = None
    #: Where the host's time went in two more steps, function by function, under ``cProfile``
    #: (:func:`bench.host_profile.profile_host`; on CUDA after the ``torch.profiler`` step).
    host_profile: dict[str, Any] | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    notes: list[str] = field(default_factory=list)
    #: The last frames of the exception of a failed run.
    traceback: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the JSON, fields in declaration order."""
        return asdict(self)


#: Every field of a result row; a row has all of them (``None`` where not measured).
ROW_FIELDS = tuple(item.name for item in fields(ResultRow))
