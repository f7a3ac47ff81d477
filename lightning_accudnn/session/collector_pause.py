"""Python's cyclic garbage collector held off while a training pass is open.

A pass that swaps makes a few small objects per swapped tensor (its record, device blocks,
weak references, autograd's handle) that live until its backward. With the collector on,
the young-generation collections that their allocation sets off promote them to the oldest
generation, and every few steps so many have been promoted that Python runs a full
collection over every object of the process: a pause of a large part of a step (the
host-overhead benchmark counts them). Paused from the forward to the end of the backward,
nothing is collected meanwhile, and the pass's objects are freed by reference counting when
it ends, so none is promoted. Collection resumes as soon as the pass closes or fails; cyclic
garbage made during the pass is collected then. A pass whose backward never runs keeps it
off until the next pass starts, the session aborts or closes, or evaluation starts. A
collector that was off stays off.
"""

from __future__ import annotations

import gc

__all__ = ["CollectorPause"]


class CollectorPause:
    """Pause the collector (:meth:`pause`) and turn it back on (:meth:`resume`), idempotently.

    Only a collector this object turned off is turned back on, and ``enabled=False`` makes
    both calls do nothing.

    Example:
        >>> pause = CollectorPause()
        >>> pause.pause(); gc.isenabled()
        False
        >>> pause.resume(); gc.isenabled()
        True
        >>> gc.disable(); pause.pause(); pause.resume(); gc.isenabled()  # off before: stays off
        False
        >>> gc.enable()
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._paused = False

    def pause(self) -> None:
        if self.enabled and not self._paused and gc.isenabled():
            gc.disable()
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            gc.enable()
