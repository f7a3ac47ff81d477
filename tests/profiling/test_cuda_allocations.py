"""What a CUDA step allocates beyond its tensors' bytes: the allocator's rounding, cuBLAS's workspaces."""

from __future__ import annotations

import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.profiling.cuda_allocations import CUDA_BLOCK_BYTES, blas_workspace_bytes
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step
from lightning_accudnn.profiling.working_memory import StorageLog

MIB = 2**20


def test_each_storage_is_counted_as_the_allocator_rounds_it():
    log = StorageLog(block_bytes=CUDA_BLOCK_BYTES)
    scalar, odd, exact = torch.ones(()), torch.ones(250), torch.ones(128)  # 4, 1000 and 512 bytes
    log.created([scalar, odd, exact])
    assert log.peak_bytes() == 512 + 1024 + 512
    exact_log = StorageLog()  # no rounding by default: exact bytes
    exact_log.created([scalar, odd])
    assert exact_log.peak_bytes() == 1004


def _trace(build, gpu: str, shape=(64, 64)):
    return trace_step(build, shape, tracker=LayerTracker(), gpu=get_gpu(gpu), meter=WorkingMemoryMeter)


def test_the_workspaces_of_both_threads_are_held_all_step_by_a_step_that_multiplies_matrices():
    """Forward and backward multiply matrices: two threads' cuBLAS and cuBLASLt workspaces, 32 MiB
    and 1 MiB each on a Hopper GPU, 8 MiB + 128 KiB and 1 MiB on an Ampere one, held at every
    moment of the step, so beyond every level the step's readings go to."""
    assert blas_workspace_bytes((9, 0), threads=2) == 2 * (32 * MIB + MIB)
    assert blas_workspace_bytes((8, 0), threads=2) == 2 * (8 * MIB + 128 * 2**10 + MIB)
    build = lambda: nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))  # noqa: E731
    hopper, ampere = _trace(build, "h100"), _trace(build, "a100")
    more = 2 * (32 * MIB - 8 * MIB - 128 * 2**10)
    assert hopper.allocated_peak_bytes - ampere.allocated_peak_bytes == more
    assert hopper.working_bytes - ampere.working_bytes == more
    saving = [(h, a) for h, a in zip(hopper.layers, ampere.layers, strict=True) if h.saved]
    assert [h.name for h, _ in saving] == ["0", "1"]  # the levels the step's readings go to
    for h, a in saving:
        assert h.forward_working_bytes - a.forward_working_bytes == more
        assert h.backward_working_bytes - a.backward_working_bytes == more


class _Shift(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def test_only_the_threads_that_multiply_matrices_hold_a_workspace():
    """A frozen Linear multiplies in forward only (its backward has nothing to compute): one
    thread's workspaces; a step without a matrix product holds none."""

    def frozen() -> nn.Module:
        model = nn.Sequential(nn.Linear(64, 64), _Shift())
        model[0].requires_grad_(False)
        return model

    hopper, ampere = _trace(frozen, "h100"), _trace(frozen, "a100")
    assert hopper.allocated_peak_bytes - ampere.allocated_peak_bytes == 32 * MIB - 8 * MIB - 128 * 2**10
    no_blas = lambda: nn.Sequential(_Shift(), nn.ReLU())  # noqa: E731
    assert _trace(no_blas, "h100").allocated_peak_bytes == _trace(no_blas, "a100").allocated_peak_bytes < MIB


class _ScaledClassifier(nn.Module):
    """Runs an op of its own before its first layer, saves nothing there, and ends with many
    classes: the loss's saves and their gradients dwarf the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4096))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x * 2.0)


def test_the_step_s_own_code_is_ordered_at_its_loss_whose_saves_come_back_first():
    """The engine orders layers by their first own save: the step's own code, which saved nothing
    before the first layer, comes after the last one, so that swapping everything brings the
    loss's log-probabilities back at the start of the backward, beside their two float32
    gradients, and the least budget counts them there."""
    from lightning_accudnn.planner.plan import swap_everything_peak_bytes
    from lightning_accudnn.profile import ROOT_LAYER

    trace = trace_step(
        _ScaledClassifier, (256, 64), tracker=LayerTracker(), loss="cross-entropy", meter=WorkingMemoryMeter
    )
    names = [layer.name for layer in trace.layers if layer.saved]
    assert names[0] == "body.0" and names[-1] == ROOT_LAYER
    profile = trace.to_profile(get_gpu("h100"), optimizer="sgd", min_swap_bytes=0)
    log_probabilities = 256 * 4096 * 4
    gradients = sum(parameter.numel() * 4 for parameter in _ScaledClassifier().parameters())  # not made yet
    assert swap_everything_peak_bytes(profile) >= profile.static_bytes - gradients + 3 * log_probabilities
