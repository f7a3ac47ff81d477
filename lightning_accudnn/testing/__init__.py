"""Helpers users and tests share: a simulated GPU for machines without one. Imports torch and ops."""

from lightning_accudnn.testing.allocator import SimulatedOutOfMemory, StreamOrderedAllocator
from lightning_accudnn.testing.simulated_gpu import SimulatedGPU
from lightning_accudnn.testing.tensor_bytes import OpBytesAllocator

__all__ = ["OpBytesAllocator", "SimulatedGPU", "SimulatedOutOfMemory", "StreamOrderedAllocator"]
