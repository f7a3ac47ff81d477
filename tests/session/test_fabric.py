"""OffloadSession inside a Lightning Fabric loop trains exactly like the same loop without it."""

import copy

import torch
from lightning.fabric import Fabric

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.models import SmallResNet, loss_of, make_batch
from tests.session.helpers import memory_need


def _fabric_loop(model, session=None, steps=4):
    fabric = Fabric(accelerator="cpu", devices=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    swapped = []
    for index in range(steps):
        batch = make_batch("cnn", 8, seed=index)
        if session is None:
            loss = loss_of(model, batch)
        else:
            with session.step(model, optimizer):
                loss = loss_of(model, batch)
        fabric.backward(loss)
        if session is not None:
            swapped.append(session.stats.bytes_swapped_out)
        optimizer.step()
        optimizer.zero_grad()
    return swapped


def test_fabric_loop_with_the_session_equals_plain_fabric_bitwise():
    torch.manual_seed(0)
    plain = SmallResNet()
    swapped = copy.deepcopy(plain)
    static, saved = memory_need(
        copy.deepcopy(plain), torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9), "cnn"
    )
    _fabric_loop(plain)
    with OffloadSession(OffloadConfig(budget=static + saved // 2, min_swap_bytes=0), "cpu") as session:
        bytes_out = _fabric_loop(swapped, session)
        assert session.plan is not None and session.plan.swapped_layers
        assert session.stats.peak_device_bytes <= static + saved // 2
    assert all(value > 0 for value in bytes_out)
    for a, b in zip(plain.state_dict().values(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b)
