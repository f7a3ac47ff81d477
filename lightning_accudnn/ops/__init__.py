"""The offload mechanism: saved-tensor hooks, the runtime (streams), pinned pool. Imports torch only."""

from lightning_accudnn.ops.engine import OffloadEngine, StepStats, keep_on_device
from lightning_accudnn.ops.errors import HostMemoryExceeded, StaleSavedTensorError
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.ledger import DeviceLedger
from lightning_accudnn.ops.pool import HostBufferPool
from lightning_accudnn.ops.runtime import CudaRuntime, HostCopyRuntime, Runtime, StreamEvent, make_runtime
from lightning_accudnn.ops.schedule import SwapSchedule

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
    "StreamEvent",
    "make_runtime",
]
