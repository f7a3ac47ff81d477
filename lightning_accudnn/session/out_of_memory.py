"""Out-of-memory errors in planned passes: how many retries in a row, and what a retry frees.

A planned pass that runs out of device memory is aborted and re-planned with a larger reserve
(:meth:`~lightning_accudnn.session.OffloadSession.recover_from_out_of_memory`), at most
:data:`MAX_OUT_OF_MEMORY_RETRIES` times in a row; a pass that completes starts the count again.
"""

from __future__ import annotations

import gc

import torch

from lightning_accudnn.planner.budget import format_bytes

__all__ = [
    "MAX_OUT_OF_MEMORY_RETRIES",
    "OutOfMemoryAfterRetriesError",
    "OutOfMemoryRetries",
    "ProfilingPassOutOfMemoryError",
    "is_out_of_memory",
    "release_failed_pass",
]

#: How many times in a row a planned pass that ran out of device memory is re-planned with a
#: larger reserve and retried before the error ends the run.
MAX_OUT_OF_MEMORY_RETRIES = 3


def is_out_of_memory(error: BaseException) -> bool:
    """True for a device out-of-memory error (``torch.OutOfMemoryError``, CUDA's included).

    Example:
        >>> is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")), is_out_of_memory(ValueError())
        (True, False)
    """
    return isinstance(error, torch.OutOfMemoryError)


class ProfilingPassOutOfMemoryError(torch.OutOfMemoryError):
    """The profiling pass ran out of device memory under the budget: the budget is too small.

    That pass (the first of each batch shape) swaps every activation and recomputes none, so
    no plan can need less of it: no retry can help. Still a ``torch.OutOfMemoryError`` (code
    that catches one still does), with what to do in its message and the device's own
    error as its cause.

    Example:
        >>> error = ProfilingPassOutOfMemoryError(3 * 2**30, torch.OutOfMemoryError("CUDA out of memory"))
        >>> isinstance(error, torch.OutOfMemoryError), error.budget_bytes
        (True, 3221225472)
        >>> "Raise the budget" in str(error)
        True
    """

    def __init__(self, budget_bytes: int, error: BaseException) -> None:
        self.budget_bytes = budget_bytes
        super().__init__(
            f"memory budget {format_bytes(budget_bytes)} is too small for this training step: its "
            "profiling pass (the first pass of a batch shape, which swaps every activation and "
            "recomputes none) ran out of device memory under it, and no plan needs less. What a "
            "step holds besides the activations its layers save is never swapped: the model state, "
            "and working memory such as a loss's float32 logits. Raise the budget, or lower the "
            f"batch size so that the activations shrink. The device said: {error}"
        )


class OutOfMemoryAfterRetriesError(torch.OutOfMemoryError):
    """A planned pass ran out of device memory again after :data:`MAX_OUT_OF_MEMORY_RETRIES`
    re-plans in a row, each with a larger reserve: what the step holds beyond the plan's count
    (workspaces, gradients in flight, the allocator's fragmentation) does not fit the budget.

    Still a ``torch.OutOfMemoryError``, with the budget, the reserve reached and what to do in
    its message and the device's own error as its cause.

    Example:
        >>> error = OutOfMemoryAfterRetriesError(
        ...     4 * 2**30, 2**30, torch.OutOfMemoryError("CUDA out of memory")
        ... )
        >>> isinstance(error, torch.OutOfMemoryError), error.reserve_bytes
        (True, 1073741824)
        >>> "expandable_segments:True" in str(error)
        True
    """

    def __init__(self, budget_bytes: int, reserve_bytes: int, error: BaseException) -> None:
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        super().__init__(
            f"this training step ran out of device memory under its memory budget of "
            f"{format_bytes(budget_bytes)} {MAX_OUT_OF_MEMORY_RETRIES + 1} times in a row, re-planned "
            f"each time with a larger reserve (now {format_bytes(reserve_bytes)}) for what the plan "
            "does not count: kernel workspaces, gradients in flight, the caching allocator's "
            "fragmentation. Raise the budget, or lower the batch size; when the device's message "
            "below shows much memory reserved but unallocated, set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the process starts (less "
            f"fragmentation). The device said: {error}"
        )


class OutOfMemoryRetries:
    """The retries taken in a row since the last pass that completed.

    Example:
        >>> retries = OutOfMemoryRetries()
        >>> [retries.take() for _ in range(MAX_OUT_OF_MEMORY_RETRIES + 1)]
        [True, True, True, False]
        >>> retries.reset(); retries.take(), retries.count
        (True, 1)
    """

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def take(self) -> bool:
        """Count one more retry; ``False`` (nothing counted) when none is left."""
        if self.count >= MAX_OUT_OF_MEMORY_RETRIES:
            return False
        self.count += 1
        return True

    def reset(self) -> None:
        """A pass completed."""
        self.count = 0


def release_failed_pass(device: torch.device) -> None:
    """Free what a failed pass left unreachable, before its step runs again.

    Call it once the error is gone (after the ``except`` block that caught it): the pass's
    tensors held by reference cycles (its exception's traceback frames, closures) wait for
    Python's collector, which runs here, and the CUDA allocator's cached blocks go back so
    that the retry starts from what its plan counts.

    Example:
        >>> release_failed_pass(torch.device("cpu"))
    """
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
