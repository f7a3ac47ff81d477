"""A count of device-resident bytes: model state plus the saved activations alive now."""

from __future__ import annotations


class DeviceLedger:
    """Counts bytes on the device as the engine sees them and remembers the peak.

    On CPU (host-copy backend) this is the measure of memory a budget bounds; on CUDA it
    sits beside the allocator's own figures as the modelled view.

    Example:
        >>> ledger = DeviceLedger()
        >>> ledger.start_step(static_bytes=100)
        >>> ledger.acquire(50); ledger.activation_bytes -= 50; ledger.acquire(20)
        >>> ledger.current_bytes, ledger.peak_bytes
        (120, 150)
    """

    __slots__ = ("static_bytes", "activation_bytes", "peak_activation_bytes")

    def __init__(self) -> None:
        self.static_bytes = 0
        self.activation_bytes = 0
        self.peak_activation_bytes = 0  # model state is constant in a step: the peak is of these

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
        """Count ``nbytes`` more, and the peak with them: the one place the count grows (bytes
        leave it by a plain subtraction from ``activation_bytes``)."""
        current = self.activation_bytes + nbytes
        self.activation_bytes = current
        if current > self.peak_activation_bytes:
            self.peak_activation_bytes = current
