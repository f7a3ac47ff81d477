"""Errors the offload engine raises."""


class HostMemoryExceeded(RuntimeError):
    """Swapping would pass the host-memory cap; the message says which knob to turn."""


class StaleSavedTensorError(RuntimeError):
    """A saved activation of an aborted step was asked for after its buffers were freed."""
