"""The engine's host buffers are host memory, its copies brought back device memory, whatever
their dtype: the CPU's stand-in for CUDA's allocator counts the second and not the first."""

from __future__ import annotations

import threading

import pytest
import torch

from lightning_accudnn.ops.host_allocation import making_host_buffer, new_host_buffer
from lightning_accudnn.ops.runtime import HostCopyRuntime
from lightning_accudnn.testing import OpBytesAllocator, SimulatedGPU


@pytest.mark.parametrize("runtime", [HostCopyRuntime(), SimulatedGPU()], ids=["host-copy", "simulated"])
def test_host_buffers_are_not_counted_and_flat_byte_copies_brought_back_are(runtime) -> None:
    allocator = OpBytesAllocator()
    with allocator.counting():
        host = runtime.allocate_host(4096)
        after_host = allocator.allocated_bytes
        brought_back = runtime.allocate((1024,), (1,), torch.uint8)  # a save's storage, as bytes
        after_copy = allocator.allocated_bytes
    assert host.dtype == brought_back.dtype == torch.uint8
    assert (after_host, after_copy) == (0, 1024)


def test_only_the_thread_making_a_host_buffer_is_marked() -> None:
    seen: list[bool] = []
    started, release = threading.Event(), threading.Event()

    def watch() -> None:
        started.wait()
        seen.append(making_host_buffer())
        release.set()

    class Marking(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(making_host_buffer())
            started.set()
            release.wait(timeout=10)
            return func(*args, **(kwargs or {}))

    watcher = threading.Thread(target=watch)
    watcher.start()
    with Marking():
        new_host_buffer(16, pin_memory=False)
    watcher.join()
    assert seen == [True, False]
    assert not making_host_buffer()
