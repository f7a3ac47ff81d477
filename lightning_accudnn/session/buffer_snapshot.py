"""The model's buffers and the random number generators as they were before a step, so that a
retried step starts from them."""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn.session._torch_internals import copy_all

__all__ = ["BufferSnapshot"]


class BufferSnapshot:
    """A copy of ``model``'s buffers (BatchNorm's running statistics and counters), on their
    device, and of the random number generators' states (CPU, and CUDA's once initialised).

    A forward pass updates some buffers in place and draws random numbers (dropout); a step
    retried after an error would update them twice and draw others. :meth:`take` before the
    step, :meth:`restore` before running it again, and the retried step is the step that would
    have run. The copy costs the buffers' bytes once and one fused copy per step.

    Example:
        >>> model = nn.BatchNorm1d(4)
        >>> snapshot = BufferSnapshot(model)
        >>> snapshot.take()
        >>> _ = model(torch.randn(8, 4))  # updates the running statistics
        >>> snapshot.restore()
        >>> bool(model.running_mean.eq(0).all()), int(model.num_batches_tracked)
        (True, 0)
    """

    def __init__(self, model: nn.Module) -> None:
        self.buffers = [buffer for buffer in model.buffers() if buffer.device.type != "meta"]
        self.copies = [buffer.detach().clone() for buffer in self.buffers]
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng: list[torch.Tensor] = []

    def bytes_on(self, device: torch.device) -> int:
        """Bytes the copy holds on ``device`` (its type and index; no index: the current one).

        Example:
            >>> BufferSnapshot(nn.BatchNorm1d(4)).bytes_on(torch.device("cpu"))
            40
        """
        return sum(
            copy.untyped_storage().nbytes()
            for copy in self.copies
            if copy.device.type == device.type and (device.index is None or copy.device.index == device.index)
        )

    def take(self) -> None:
        with torch.no_grad():
            copy_all(self.copies, self.buffers)
        self._cpu_rng = torch.get_rng_state()
        self._cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []

    def restore(self) -> None:
        with torch.no_grad():
            copy_all(self.buffers, self.copies)
        torch.set_rng_state(self._cpu_rng)
        if self._cuda_rng:
            torch.cuda.set_rng_state_all(self._cuda_rng)
