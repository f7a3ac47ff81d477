"""What a CUDA training step allocates beyond its tensors' bytes, as PyTorch's defaults make it.

A traced step counts its tensors' storages (:mod:`.working_memory`); a CUDA device's allocated
bytes (``torch.cuda.memory_allocated``) hold more:

* the caching allocator rounds every block up to a multiple of :data:`CUDA_BLOCK_BYTES`;
* cuBLAS workspaces. PyTorch gives each cuBLAS handle (one per thread) a workspace on each stream
  it runs on, taken from the caching allocator and kept for the process's life:
  ``CUBLAS_WORKSPACE_CONFIG``'s default, 32 MiB on Hopper and Blackwell (compute capability 9 to
  12) and 8 MiB + 128 KiB on earlier GPUs (PyTorch's ``CublasHandlePool.cpp``); and a cuBLASLt
  workspace (the matmuls with a bias epilogue) of ``CUBLASLT_WORKSPACE_SIZE``'s default, 1 MiB. A
  training step's forward runs in the caller's thread and its backward in autograd's device
  thread: a step that multiplies matrices in both holds two of each from its second step on. (On
  the H200, PyTorch 2.11, GPT-2 medium's step held 65 MiB besides its weights and batch before its
  forward: two cuBLAS workspaces and one cuBLASLt workspace.) The environment variables are not
  read: the defaults are planned for.

Example:
    >>> blas_workspace_bytes((9, 0), threads=2) / 2**20
    66.0
    >>> blas_workspace_bytes((8, 0), threads=1) / 2**20
    9.125
"""

from __future__ import annotations

import torch

__all__ = ["BLAS_OPS", "CUDA_BLOCK_BYTES", "blas_workspace_bytes", "runs_blas"]

#: The caching allocator's block granularity: every allocation is rounded up to a multiple.
CUDA_BLOCK_BYTES = 512

#: ATen ops that CUDA runs with cuBLAS (matrix products), by name.
BLAS_OPS = frozenset(
    {
        "mm",
        "addmm",
        "_addmm_activation",
        "bmm",
        "baddbmm",
        "addbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_scaled_mm",
    }
)

_MIB = 2**20
_CUBLASLT_WORKSPACE_BYTES = _MIB


def runs_blas(func: torch._ops.OpOverload) -> bool:
    """Whether CUDA runs ``func`` with cuBLAS.

    Example:
        >>> runs_blas(torch.ops.aten.addmm.default), runs_blas(torch.ops.aten.relu.default)
        (True, False)
    """
    return func._overloadpacket.__name__ in BLAS_OPS


def blas_workspace_bytes(capability: tuple[int, int], threads: int) -> int:
    """The cuBLAS and cuBLASLt workspaces PyTorch keeps for ``threads`` threads that multiply
    matrices on one stream of a GPU of compute capability ``capability`` (see the module
    docstring); the cuBLASLt one is counted for each thread.

    Example:
        >>> blas_workspace_bytes((9, 0), threads=0)
        0
    """
    cublas = 32 * _MIB if 9 <= capability[0] <= 12 else 8 * _MIB + 128 * 2**10
    return threads * (cublas + _CUBLASLT_WORKSPACE_BYTES)
