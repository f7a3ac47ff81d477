"""What the engine is told to do in one step: which layers swap, how far to prefetch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from lightning_accudnn.ops.layers import RecordName


@dataclass(frozen=True)
class SwapSchedule:
    """The engine's orders for a step; the engine itself holds no policy.

    ``swap_layers`` names the layer invocations (see :mod:`.layers`) whose saved
    activations go to the host; ``None`` swaps every layer (the safe profiling mode) except
    those in ``keep_layers``. A plan keeps what it chose to keep by name and swaps the rest,
    so a layer it has never seen (the graph changed) is swapped, the safe side for memory.
    ``prefetch_window_bytes`` bounds the bytes brought back ahead of use in backward and
    not yet consumed; one layer is always allowed in even when it is larger.
    ``max_copying_out_bytes`` bounds the device bytes of swapped storages still held in the
    engine's in-flight FIFO: past it (and while the FIFO holds more than one storage) the
    compute stream waits on the oldest copy and its device bytes go, in stream order.
    ``None``: no bound, so nothing swapped leaves the device before backward.
    With ``keep_beyond_host_limit`` a storage that does not fit in the host pool's cap stays
    on the device (still counted as swappable) instead of raising
    :class:`~lightning_accudnn.ops.HostMemoryExceeded`: the profiling pass measures every
    activation within any host cap, and the plan made from it is checked against the cap.
    ``held_records`` names the records (:data:`.layers.RecordName`) whose storages stay on the
    device whatever their layer: storages an earlier pass of the same graph found the model's
    code holding beyond the forward (:data:`.layers.HELD`), which a swap would copy out and back
    without freeing them. A hooked pass reads it (a replayed one keeps what its sequence says).

    Example:
        >>> schedule = SwapSchedule.swap_layers_named(["layer1.0.conv1"], prefetch_window_bytes=2**26)
        >>> schedule.swaps("layer1.0.conv1"), schedule.swaps("fc")
        (True, False)
        >>> SwapSchedule.swap_everything().swaps("fc")
        True
        >>> SwapSchedule.keep_layers_named(["fc"]).swaps("a_new_layer")
        True
        >>> ("conv1", 0) in SwapSchedule.swap_everything().with_held_records({("conv1", 0)}).held_records
        True
    """

    swap_layers: frozenset[str] | None
    prefetch_window_bytes: int = 0
    max_copying_out_bytes: int | None = None
    keep_layers: frozenset[str] = frozenset()
    keep_beyond_host_limit: bool = False
    held_records: frozenset[RecordName] = frozenset()

    def __post_init__(self) -> None:
        if self.prefetch_window_bytes < 0:
            raise ValueError(f"prefetch_window_bytes must be >= 0, got {self.prefetch_window_bytes}")
        if self.max_copying_out_bytes is not None and self.max_copying_out_bytes < 0:
            raise ValueError(f"max_copying_out_bytes must be >= 0, got {self.max_copying_out_bytes}")

    @classmethod
    def swap_everything(
        cls,
        prefetch_window_bytes: int = 0,
        max_copying_out_bytes: int | None = None,
        *,
        keep_beyond_host_limit: bool = False,
    ) -> SwapSchedule:
        return cls(
            None, prefetch_window_bytes, max_copying_out_bytes, keep_beyond_host_limit=keep_beyond_host_limit
        )

    @classmethod
    def keep_everything(cls) -> SwapSchedule:
        return cls(frozenset(), 0)

    @classmethod
    def swap_layers_named(
        cls, names: Iterable[str], prefetch_window_bytes: int = 0, max_copying_out_bytes: int | None = None
    ) -> SwapSchedule:
        return cls(frozenset(names), prefetch_window_bytes, max_copying_out_bytes)

    @classmethod
    def keep_layers_named(
        cls, names: Iterable[str], prefetch_window_bytes: int = 0, max_copying_out_bytes: int | None = None
    ) -> SwapSchedule:
        return cls(None, prefetch_window_bytes, max_copying_out_bytes, frozenset(names))

    def with_held_records(self, names: Iterable[RecordName]) -> SwapSchedule:
        """This schedule, keeping the storages of the records ``names`` on the device."""
        return replace(self, held_records=frozenset(names))

    def swaps(self, layer: str) -> bool:
        if layer in self.keep_layers:
            return False
        return self.swap_layers is None or layer in self.swap_layers
