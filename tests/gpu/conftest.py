"""Fixtures of the CUDA tests."""

import pytest
import torch


@pytest.fixture
def deterministic_cuda():
    """cuDNN's deterministic kernels and no autotuning, so runs compare bit for bit; the cache
    emptied after the test."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    yield
    torch.cuda.empty_cache()
