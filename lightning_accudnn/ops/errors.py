"""Errors the offload engine raises."""


class HostMemoryExceeded(RuntimeError):
    """Swapping would pass the host-memory cap; the message says which knob to turn."""


class StaleSavedTensorError(RuntimeError):
    """A saved activation of an aborted step was asked for after its buffers were freed."""


class RecomputationError(RuntimeError):
    """A segment the plan recomputes could not be recomputed exactly in backward.

    ``segment`` is the module's qualified name and ``reason`` why. The step it happened in
    computed no trustworthy gradient: it is aborted and, where the driver can (Lightning's
    automatic optimization), run again under a plan that keeps the segment's activations.

    Example:
        >>> error = RecomputationError("blocks.3", "its forward raised ValueError: boom")
        >>> error.segment, str(error).startswith("recomputing segment 'blocks.3' failed")
        ('blocks.3', True)
    """

    def __init__(self, segment: str, reason: str) -> None:
        super().__init__(
            f"recomputing segment {segment!r} failed: {reason}. The segment is excluded from later plans; "
            f"to keep it from being recomputed at all, pass keep_on_device=[{segment!r}] or policy='swap'"
        )
        self.segment = segment
        self.reason = reason
