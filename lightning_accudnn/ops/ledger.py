"""A count of device-resident bytes: model state plus the saved activations alive now."""

from __future__ import annotations

from typing import Protocol


class LedgerObserver(Protocol):
    """Told of every change of a :class:`DeviceLedger` (see :mod:`.working_memory`)."""

    def changing(self, ledger_bytes: int) -> None: ...

    def acquired(self, nbytes: int) -> None: ...

    def released(self, nbytes: int) -> None: ...


class DeviceLedger:
    """Counts bytes on the device as the engine sees them and remembers the peak.

    On CPU (host-copy backend) this is the measure of memory a budget bounds; on CUDA it
    sits beside the allocator's own figures as the modelled view.

    Example:
        >>> ledger = DeviceLedger()
        >>> ledger.start_step(static_bytes=100)
        >>> ledger.acquire(50); ledger.release(50); ledger.acquire(20)
        >>> ledger.current_bytes, ledger.peak_bytes
        (120, 150)
    """

    __slots__ = ("static_bytes", "activation_bytes", "peak_activation_bytes", "observer")

    def __init__(self) -> None:
        self.static_bytes = 0
        self.activation_bytes = 0
        self.peak_activation_bytes = 0  # model state is constant in a step: the peak is of these
        #: Told of every change while set (a hooked pass measuring its working memory).
        self.observer: LedgerObserver | None = None

    @property
    def current_bytes(self) -> int:
        return self.static_bytes + self.activation_bytes

    @property
    def peak_bytes(self) -> int:
        return self.static_bytes + self.peak_activation_bytes

    def start_step(self, static_bytes: int) -> None:
        """Set the model-state bytes for this step and restart the peak from now."""
        self.static_bytes = static_bytes
        self.peak_activation_bytes = self.activation_bytes

    def acquire(self, nbytes: int) -> None:
        """Count ``nbytes`` more, and the peak with them: the one place the count grows."""
        observer = self.observer
        if observer is not None:
            observer.changing(self.static_bytes + self.activation_bytes)
            observer.acquired(nbytes)
        current = self.activation_bytes + nbytes
        self.activation_bytes = current
        if current > self.peak_activation_bytes:
            self.peak_activation_bytes = current

    def release(self, nbytes: int) -> None:
        """Count ``nbytes`` less: the one place the count falls."""
        observer = self.observer
        if observer is not None:
            observer.changing(self.static_bytes + self.activation_bytes)
            observer.released(nbytes)
        self.activation_bytes -= nbytes
