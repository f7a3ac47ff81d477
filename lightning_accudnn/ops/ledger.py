"""A count of device-resident bytes: model state plus the saved activations alive now."""

from __future__ import annotations

from types import MemberDescriptorType
from typing import Protocol


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


class LedgerObserver(Protocol):
    """Told of every change of an :class:`ObservedLedger` (see :mod:`.working_memory`)."""

    def changing(self, ledger_bytes: int) -> None: ...

    def acquired(self, nbytes: int) -> None: ...

    def released(self, nbytes: int) -> None: ...


#: The slot, read and written past :class:`ObservedLedger`'s property.
_ACTIVATION_BYTES: MemberDescriptorType = DeviceLedger.__dict__["activation_bytes"]


class ObservedLedger(DeviceLedger):
    """A :class:`DeviceLedger` that tells ``observer`` of every change of its activation bytes,
    before it takes effect. The engine counts on one only in a pass that observes it, so that
    the others pay nothing for it.

    Example:
        >>> class Printer:
        ...     def changing(self, ledger_bytes): print("at", ledger_bytes)
        ...     def acquired(self, nbytes): print("+", nbytes)
        ...     def released(self, nbytes): print("-", nbytes)
        >>> ledger = DeviceLedger(); ledger.start_step(static_bytes=100); ledger.acquire(50)
        >>> observed = ObservedLedger(ledger, Printer())
        >>> observed.acquire(20); observed.activation_bytes -= 30
        at 150
        + 20
        at 170
        - 30
        >>> observed.current_bytes, observed.peak_bytes
        (140, 170)
    """

    __slots__ = ("observer",)

    def __init__(self, ledger: DeviceLedger, observer: LedgerObserver) -> None:
        self.observer = observer
        self.static_bytes = ledger.static_bytes
        _ACTIVATION_BYTES.__set__(self, ledger.activation_bytes)
        self.peak_activation_bytes = ledger.peak_activation_bytes

    @property
    def activation_bytes(self) -> int:
        return int(_ACTIVATION_BYTES.__get__(self))

    @activation_bytes.setter
    def activation_bytes(self, value: int) -> None:
        before = int(_ACTIVATION_BYTES.__get__(self))
        self.observer.changing(self.static_bytes + before)
        if value > before:
            self.observer.acquired(value - before)
        elif value < before:
            self.observer.released(before - value)
        _ACTIVATION_BYTES.__set__(self, value)

    def unobserved(self) -> DeviceLedger:
        """A plain ledger with the same counts."""
        ledger = DeviceLedger()
        ledger.static_bytes = self.static_bytes
        ledger.activation_bytes = self.activation_bytes
        ledger.peak_activation_bytes = self.peak_activation_bytes
        return ledger
