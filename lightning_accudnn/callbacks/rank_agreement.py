"""Ranks agree on every trial, so that they choose alike and none waits for another forever.

During the search each rank trains on its own (no gradient synchronisation, no other
collective), so an out-of-memory error on one rank cannot leave the others blocked inside
a step. After each trial every rank calls :meth:`RankAgreement.trial` exactly once: the
trial counts as failed if it failed anywhere, its throughput is the slowest rank's (DDP
steps as fast as its slowest rank) and its peak the highest. An unexpected error on one
rank is raised on every rank. Outside a process group it all reduces to the identity.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch.distributed as dist

from lightning_accudnn.callbacks.batch_search import Trial

__all__ = ["RankAgreement", "TrialError", "merge_trials"]

T = TypeVar("T")


class TrialError(RuntimeError):
    """Another rank raised during the batch-size search (every rank raises, none waits).

    Example:
        >>> str(TrialError("rank 1 failed during the batch-size search: ValueError: bug"))
        'rank 1 failed during the batch-size search: ValueError: bug'
    """


def merge_trials(trials: list[Trial]) -> Trial:
    """One trial from every rank's: failed if any failed, slowest throughput, highest peak.

    Example:
        >>> merge_trials([Trial(8, 100.0, 0.08, 10), Trial(8, 90.0, 0.09, 12)])
        Trial(batch_size=8, samples_per_second=90.0, seconds_per_batch=0.09, peak_bytes=12, failure=None)
        >>> merge_trials([Trial(8, 100.0), Trial(8, failure="out of memory")]).failure
        'rank 1: out of memory'
    """
    first = trials[0]
    failures = [(rank, t.failure) for rank, t in enumerate(trials) if not t.ok]
    peaks = [t.peak_bytes for t in trials if t.peak_bytes is not None]
    peak = max(peaks) if peaks else None
    if failures:
        rank, failure = failures[0]
        text = failure or "no timed step"
        return Trial(
            first.batch_size, peak_bytes=peak, failure=text if len(trials) == 1 else f"rank {rank}: {text}"
        )
    rates = [t.samples_per_second for t in trials if t.samples_per_second is not None]
    seconds = [t.seconds_per_batch for t in trials if t.seconds_per_batch is not None]
    return Trial(
        first.batch_size,
        samples_per_second=min(rates),
        seconds_per_batch=max(seconds) if seconds else None,
        peak_bytes=peak,
    )


class RankAgreement:
    """Collectives the search needs: agree on a trial, take rank zero's object.

    Example:
        >>> agreement = RankAgreement()  # no process group: every call is the identity
        >>> agreement.trial(Trial(8, 100.0), error=None)
        Trial(batch_size=8, samples_per_second=100.0, seconds_per_batch=None, peak_bytes=None, failure=None)
    """

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.distributed else 0

    def trial(self, trial: Trial, error: BaseException | None) -> Trial:
        """The agreed trial; raises on every rank if ``error`` (not an OOM) happened on some rank."""
        message = None if error is None else f"{type(error).__name__}: {error}"
        gathered = self._gather((trial, message))
        errors = [(rank, text) for rank, (_, text) in enumerate(gathered) if text is not None]
        if errors:
            if error is not None:
                raise error
            rank, text = errors[0]
            raise TrialError(f"rank {rank} failed during the batch-size search: {text}")
        return merge_trials([t for t, _ in gathered])

    def from_rank_zero(self, obj: T) -> T:
        """Rank zero's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered
