"""A model compiled whole is refused before anything runs, with one message showing the
regional form; a regionally compiled model is accepted."""

import pytest
import torch
from torch import nn

from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.compiled import CompiledModelError


def _model():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()))


def _compiled_whole():
    return torch.compile(_model(), backend="eager")


def _compiled_in_place():
    model = _model()
    model.compile(backend="eager")
    return model


@pytest.mark.parametrize(
    ("make", "form"),
    [(_compiled_whole, "torch.compile(model)"), (_compiled_in_place, "Sequential.compile() on the model")],
    ids=["torch.compile(model)", "model.compile()"],
)
def test_a_model_compiled_whole_is_refused_by_the_session_before_anything_runs(make, form):
    model = make()
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    with pytest.raises(CompiledModelError) as raised, session.step(model):
        model(torch.randn(2, 8))
    message = str(raised.value)
    assert f"found {form}" in message
    assert "block.compile()" in message and "torch.compile(model.layers[i])" in message  # the rewrite
    assert "whole_model_compile='experimental'" in message  # and the experimental option
    assert not session.engine.step_open
    session.close()


def test_a_regionally_compiled_model_is_accepted():
    model = _model()
    model[2].compile(backend="eager")
    model[0] = torch.compile(model[0], backend="eager")
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    session.check_model(model)  # nothing raised
    session.close()


def test_a_keep_on_device_pattern_inside_a_compiled_block_is_refused_naming_the_block():
    model = _model()
    model[2].compile(backend="eager")
    session = OffloadSession(OffloadConfig(budget="1GB", keep_on_device=["2.1"]), "cpu")
    with pytest.raises(CompiledModelError, match=r"name the block \('2'\) instead"):
        session.check_model(model)
    session.close()
