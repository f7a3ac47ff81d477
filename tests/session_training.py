"""A few training steps of a small CNN under an OffloadSession, shared by the host-memory tests."""

import torch

from lightning_accudnn.session import OffloadSession
from tests.models import loss_of, make_batch


def train_cnn(session: OffloadSession, model: torch.nn.Module, steps: int) -> None:
    """``steps`` SGD steps of ``model`` on the "cnn" batches, each under ``session.step``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for index in range(steps):
        with session.step(model, optimizer):
            loss = loss_of(model, make_batch("cnn", seed=index))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
