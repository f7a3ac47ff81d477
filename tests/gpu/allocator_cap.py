"""An allocator cap for GPU tests; a plain reference trains under the strategy's own cap.

The cap changes the numbers, not the swapping: cuDNN picks each convolution's algorithm by the
workspace it can get, and under a cap a larger workspace fails (the allocator counts an
out-of-memory error and cuDNN takes its next algorithm). On the H100 (2026-11-23), plain
training of the tests' CNN under the cap of a 164 MB budget differed from uncapped plain
training by up to 3.3e-5 in a weight after four steps, and was bitwise equal to the same
training with swapping, under DDP and on one device alike."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def allocator_capped(budget_bytes: int) -> Iterator[None]:
    """The current device's caching allocator reserves at most ``budget_bytes`` inside the block."""
    device = torch.device("cuda", torch.cuda.current_device())  # the memory fraction needs an index
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
