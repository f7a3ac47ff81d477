"""The offload mechanism: saved-tensor hooks, copy streams, pinned pool. Imports torch only."""

from lightning_accudnn.ops.engine import OffloadEngine, StepStats, keep_on_device
from lightning_accudnn.ops.errors import HostMemoryExceeded, StaleSavedTensorError
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.ledger import DeviceLedger
from lightning_accudnn.ops.pool import HostBufferPool
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.ops.transfer import CudaStreamBackend, HostCopyBackend, make_backend

__all__ = [
    "CudaStreamBackend",
    "DeviceLedger",
    "HostBufferPool",
    "HostCopyBackend",
    "HostMemoryExceeded",
    "LayerTracker",
    "OffloadEngine",
    "StaleSavedTensorError",
    "StepStats",
    "SwapSchedule",
    "keep_on_device",
    "make_backend",
]
