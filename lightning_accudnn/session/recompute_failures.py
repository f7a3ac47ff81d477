"""Segments whose recomputation failed in backward: which, why, and the plans that leave them out.

The profiling pass validates every candidate segment (:class:`~lightning_accudnn.ops.recompute.SegmentProbe`),
but a recomputation can still fail in backward: its forward raises, checkpointing finds it
saved other tensors than the call did (``CheckpointError``), or an input was written in place
since the call. The step then has no trustworthy gradient. :class:`RecomputeFailures` names
the segment from the error, keeps it out of every later plan of that model, and turns the
error into a :class:`~lightning_accudnn.ops.errors.RecomputationError` that says so.
"""

from __future__ import annotations

from dataclasses import replace

from torch.utils.checkpoint import CheckpointError

from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.ops.recompute import SegmentRecomputer
from lightning_accudnn.profile import ExcludedSegment, StepProfile

__all__ = ["RecomputeFailures"]


class RecomputeFailures:
    """Per model, the segments whose recomputation failed, with why.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> failures = RecomputeFailures()
        >>> failures.exclude(7, "blocks.1", "its forward raised ValueError: boom")
        True
        >>> profile = StepProfile((LayerProfile("blocks.0.a", 1, 1), LayerProfile("blocks.1.a", 1, 1)), 0,
        ...                       segments=(SegmentProfile("blocks.0", 1), SegmentProfile("blocks.1", 1)))
        >>> [segment.name for segment in failures.applied(7, profile).segments]
        ['blocks.0']
        >>> failures.applied(7, profile).excluded_segments[0].reason
        'its forward raised ValueError: boom'
    """

    __slots__ = ("_excluded",)

    def __init__(self) -> None:
        self._excluded: dict[int, dict[str, str]] = {}

    def exclude(self, model: int, segment: str, reason: str) -> bool:
        """Keep ``segment`` of ``model`` out of later plans; ``False`` when it already was."""
        excluded = self._excluded.setdefault(model, {})
        if segment in excluded:
            return False
        excluded[segment] = reason
        return True

    def applied(self, model: int, profile: StepProfile) -> StepProfile:
        """``profile`` without the failed segments of ``model``, listing them as excluded."""
        excluded = self._excluded.get(model)
        if not excluded or not any(segment.name in excluded for segment in profile.segments):
            return profile
        listed = {entry.name for entry in profile.excluded_segments}
        return replace(
            profile,
            segments=tuple(segment for segment in profile.segments if segment.name not in excluded),
            excluded_segments=profile.excluded_segments
            + tuple(ExcludedSegment(name, why) for name, why in excluded.items() if name not in listed),
        )

    @staticmethod
    def failed_in(error: BaseException | None, recomputer: SegmentRecomputer) -> RecomputationError | None:
        """The failed recomputation ``error`` (or an error it was raised from) is about, or
        ``None``: a :class:`RecomputationError` as it is; a ``CheckpointError`` (raised by
        checkpointing right after a recomputation that saved other tensors) about the segment
        ``recomputer`` recomputed last."""
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            if isinstance(error, RecomputationError):
                return error
            if isinstance(error, CheckpointError) and recomputer.last_recomputed is not None:
                first_line = (
                    str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                )
                return RecomputationError(recomputer.last_recomputed, first_line)
            error = error.__cause__ or error.__context__
        return None
