"""CUDA's autocast policy where it differs from the CPU's: which calls are rewritten, and how."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_accudnn.profiling.cuda_autocast import cuda_autocast_args

BF16 = torch.bfloat16


@pytest.mark.parametrize(
    "call",
    [
        lambda x: (torch.pow, (x, 3.0), {}),
        lambda x: (torch.Tensor.__pow__, (x, 2), {}),
        lambda x: (torch.Tensor.__rtruediv__, (x, 1.0), {}),
        lambda x: (F.layer_norm, (x, (8,)), {}),
        lambda x: (F.softmax, (x,), {"dim": -1}),
        lambda x: (torch.Tensor.softmax, (x, -1), {}),
        lambda x: (torch.exp, (x,), {}),
        lambda x: (torch.rsqrt, (x,), {}),
        lambda x: (torch.sum, (x,), {}),
    ],
)
def test_16_bit_inputs_of_float32_ops_become_float32(call) -> None:
    x = torch.ones(4, 8, dtype=BF16)
    func, args, kwargs = call(x)
    new_args, new_kwargs, policy = cuda_autocast_args(func, args, kwargs, BF16)
    assert policy == "float32"
    assert new_args[0].dtype == torch.float32
    assert func(*new_args, **new_kwargs).dtype == torch.float32


def test_what_cuda_autocast_leaves_alone() -> None:
    x = torch.ones(4, 8, dtype=BF16)
    assert cuda_autocast_args(torch.add, (x, x), {}, BF16)[2] is None  # not in the list
    assert cuda_autocast_args(torch.Tensor.pow_, (x, 2), {}, BF16)[2] is None  # in place
    assert cuda_autocast_args(F.softmax, (x,), {"dim": -1, "dtype": BF16}, BF16)[2] is None  # explicit dtype
    assert cuda_autocast_args(torch.exp, (x.float(),), {}, BF16)[2] is None  # already float32
    assert cuda_autocast_args(torch.exp, (x.double(),), {}, BF16)[2] is None  # float64 is not eligible


def test_cuda_only_16_bit_ops_cast_float32_operands_and_lists() -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4, dtype=torch.float64)
    args, _, policy = cuda_autocast_args(torch.einsum, ("ij,jk->ik", [a, b]), {}, BF16)
    assert policy == "16-bit"
    assert [t.dtype for t in args[1]] == [BF16, torch.float64]
    assert isinstance(args[1], list)
