"""The offload mechanism: saved-tensor hooks, the runtime (streams), pinned pool. Imports torch only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_accudnn.lazy_names import lazy_names

if TYPE_CHECKING:
    from lightning_accudnn.ops.engine import OffloadEngine, StepStats, keep_on_device
    from lightning_accudnn.ops.errors import HostMemoryExceeded, StaleSavedTensorError
    from lightning_accudnn.ops.layers import LayerTracker
    from lightning_accudnn.ops.ledger import DeviceLedger
    from lightning_accudnn.ops.pool import HostBufferPool
    from lightning_accudnn.ops.runtime import (
        CudaRuntime,
        HostCopyRuntime,
        Runtime,
        StallListener,
        StreamEvent,
        make_runtime,
    )
    from lightning_accudnn.ops.schedule import SwapSchedule

#: Each name, and the module that defines it: imported on first use, so that importing one
#: module of this package (``lightning_accudnn.ops.<module>``) does not import the others.
_NAMES = {
    "OffloadEngine": "lightning_accudnn.ops.engine",
    "StepStats": "lightning_accudnn.ops.engine",
    "keep_on_device": "lightning_accudnn.ops.engine",
    "HostMemoryExceeded": "lightning_accudnn.ops.errors",
    "StaleSavedTensorError": "lightning_accudnn.ops.errors",
    "LayerTracker": "lightning_accudnn.ops.layers",
    "DeviceLedger": "lightning_accudnn.ops.ledger",
    "HostBufferPool": "lightning_accudnn.ops.pool",
    "CudaRuntime": "lightning_accudnn.ops.runtime",
    "HostCopyRuntime": "lightning_accudnn.ops.runtime",
    "Runtime": "lightning_accudnn.ops.runtime",
    "StallListener": "lightning_accudnn.ops.runtime",
    "StreamEvent": "lightning_accudnn.ops.runtime",
    "make_runtime": "lightning_accudnn.ops.runtime",
    "SwapSchedule": "lightning_accudnn.ops.schedule",
}


__getattr__, __dir__ = lazy_names(globals(), _NAMES)


__all__ = [
    "CudaRuntime",
    "DeviceLedger",
    "HostBufferPool",
    "HostCopyRuntime",
    "HostMemoryExceeded",
    "LayerTracker",
    "OffloadEngine",
    "StaleSavedTensorError",
    "StepStats",
    "SwapSchedule",
    "keep_on_device",
    "Runtime",
    "StallListener",
    "StreamEvent",
    "make_runtime",
]
