"""The offload mechanism: saved-tensor hooks, copy streams, pinned pool. Imports torch only."""

from lightning_accudnn.ops.engine import (
    DEFAULT_MIN_SWAP_BYTES,
    LayerUsage,
    OffloadEngine,
    StepStats,
    keep_on_device,
)
from lightning_accudnn.ops.errors import HostMemoryExceeded, StaleSavedTensorError
from lightning_accudnn.ops.layers import ROOT_LAYER, LayerTracker
from lightning_accudnn.ops.ledger import DeviceLedger
from lightning_accudnn.ops.pool import HostBufferPool
from lightning_accudnn.ops.schedule import SwapSchedule
from lightning_accudnn.ops.transfer import CudaStreamBackend, HostCopyBackend, make_backend

__all__ = [
    "DEFAULT_MIN_SWAP_BYTES",
    "ROOT_LAYER",
    "CudaStreamBackend",
    "DeviceLedger",
    "HostBufferPool",
    "HostCopyBackend",
    "HostMemoryExceeded",
    "LayerTracker",
    "LayerUsage",
    "OffloadEngine",
    "StaleSavedTensorError",
    "StepStats",
    "SwapSchedule",
    "keep_on_device",
    "make_backend",
]
