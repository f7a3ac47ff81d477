"""The session's device always has an index: a bare "cuda" is the current CUDA device (PyTorch
2.11's set_per_process_memory_fraction refused a bare "cuda" from examples/plain_loop.py)."""

import torch

from lightning_accudnn.session.device import with_index


def test_a_bare_cuda_device_is_the_current_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert with_index(torch.device("cuda")) == torch.device("cuda", 3)
    assert with_index(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert with_index(torch.device("cpu")) == torch.device("cpu")
