"""Python's cyclic garbage collector is off from a pass's forward to the end of its
backward (``pause_gc``, default on), back on when the pass closes or fails, and a collector the
user turned off stays off."""

import gc

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.session.helpers import sgd


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _session(**options: object) -> OffloadSession:
    return OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0, **options), "cpu")


@pytest.fixture(autouse=True)
def _collector_on():
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_from_forward_to_the_end_of_backward_in_every_pass():
    model, session = _model(), _session()
    optimizer = sgd(model)
    seen = []
    for _ in range(4):  # profiling, planned and replayed passes
        optimizer.zero_grad()
        with session.step(model, optimizer):
            loss = model(torch.randn(2, 8)).sum()
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())  # between the block and backward: the pass is still open
        loss.backward()
        seen.append(gc.isenabled())
        optimizer.step()
    assert seen == [False, False, True] * 4
    session.close()
    assert gc.isenabled()


def test_a_pass_that_fails_or_is_left_without_backward_turns_the_collector_back_on():
    model, session = _model(), _session()
    with pytest.raises(RuntimeError, match="bad batch"), session.step(model):
        model(torch.randn(2, 8)).sum()
        raise RuntimeError("bad batch")
    assert gc.isenabled()
    with session.step(model):
        model(torch.randn(2, 8)).sum()  # no backward follows
    assert not gc.isenabled()
    session.abort()
    assert gc.isenabled()
    with session.step(model):
        model(torch.randn(2, 8)).sum()
    session.close()
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_user_stays_off_and_pause_gc_false_leaves_it_alone():
    model = _model()
    gc.disable()
    session = _session()
    with session.step(model):
        loss = model(torch.randn(2, 8)).sum()
    loss.backward()
    assert not gc.isenabled()
    session.close()
    assert not gc.isenabled()
    gc.enable()
    session = _session(pause_gc=False)
    with session.step(model):
        loss = model(torch.randn(2, 8)).sum()
        assert gc.isenabled()
    loss.backward()
    assert gc.isenabled()
    session.close()


def test_pause_gc_must_be_a_bool():
    with pytest.raises(ValueError, match="pause_gc must be True or False"):
        OffloadConfig(pause_gc="yes")
