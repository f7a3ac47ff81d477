"""An error on one rank ends every rank, promptly, with that error.

Under DDP a rank that raises leaves the others blocked in the next collective (the gradient
all-reduce) until the process group's timeout, 30 minutes by default; a host-memory limit that
differs between nodes or a budget too small for one device does exactly that. The failing rank
writes its error to the process group's store (no collective: the others may be blocked in
one); every rank runs a watcher thread that polls the store and, when another rank's error is
there, reports that error and ends its own process (a thread cannot interrupt a collective
that blocks the main thread, and ending the process is what frees the launcher).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from lightning_accudnn.session._torch_internals import default_store

__all__ = ["FAILURE_KEY", "RankFailureWatch"]

log = logging.getLogger("lightning_accudnn")

#: Where the first failing rank leaves its error in the process group's store.
FAILURE_KEY = "lightning_accudnn/rank_failure"


def _end_process(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(1)


class RankFailureWatch:
    """Tell the other ranks about an error (:meth:`report`) and end this rank on theirs.

    ``store`` is the process group's key-value store (default: the default group's);
    ``poll_seconds`` how often it is checked; ``grace_seconds`` how long a rank waits after
    seeing another rank's error before ending (so that the failing rank's own exit, with its
    traceback, is the one a launcher reports first); ``end`` what ends this rank (default:
    print the message to stderr and exit the process with status 1).

    Example:
        >>> from torch.distributed import HashStore
        >>> ended = []
        >>> watch = RankFailureWatch(rank=0, store=HashStore(), poll_seconds=0.01, grace_seconds=0,
        ...                          end=ended.append)
        >>> other = RankFailureWatch(rank=1, store=watch.store)
        >>> watch.start(); other.report(MemoryError("host memory")); watch.join(timeout=5)
        >>> ended
        ['lightning-accudnn: rank 1 raised MemoryError: host memory; ending rank 0 too']
    """

    def __init__(
        self,
        rank: int,
        *,
        store: Any = None,
        poll_seconds: float = 0.5,
        grace_seconds: float = 5.0,
        end: Callable[[str], None] = _end_process,
    ) -> None:
        self.rank = rank
        self.store = store if store is not None else default_store()
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.end = end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported = False

    def report(self, error: BaseException) -> None:
        """This rank failed with ``error``: leave it for the others (the first report wins)."""
        if self.store is None or self._reported:
            return
        self._reported = True
        text = f"rank {self.rank} raised {type(error).__name__}: {error}"
        try:
            self.store.compare_set(FAILURE_KEY, "", text)  # only if no rank reported before
        except Exception:  # noqa: BLE001 - the store may be gone already; the error itself goes on
            log.debug("accudnn: could not leave the error in the store", exc_info=True)

    def start(self) -> None:
        """Watch for another rank's error from a daemon thread (idempotent)."""
        if self.store is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="accudnn-rank-failure", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (training is over on this rank)."""
        self._stop.set()
        self.join(timeout=self.poll_seconds * 4 + 1)
        self._thread = None

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                if not self.store.check([FAILURE_KEY]):
                    continue
                text = self.store.get(FAILURE_KEY).decode()
            except Exception:  # noqa: BLE001 - the store went away: the run is ending anyway
                return
            if self._reported or not text:
                return  # this rank failed itself and ends with its own error
            message = f"lightning-accudnn: {text}; ending rank {self.rank} too"
            log.error(message)
            if self._stop.wait(self.grace_seconds):
                return  # training ended on this rank meanwhile
            self.end(message)
            return
