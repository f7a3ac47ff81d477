"""Every form of torch.compile is refused before training, with one message."""

import pytest
import torch
from torch import nn

from lightning_accudnn.session import OffloadConfig, OffloadSession
from lightning_accudnn.session.compiled import CompiledModelError


def _model():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()))


def _compiled_whole():
    return torch.compile(_model())


def _compiled_in_place():
    model = _model()
    model.compile()
    return model


def _submodule_compiled_in_place():
    model = _model()
    model[2][0].compile()
    return model


def _submodule_wrapped():
    model = _model()
    model[2] = torch.compile(model[2])
    return model


@pytest.mark.parametrize(
    ("make", "form"),
    [
        (_compiled_whole, "torch.compile(model)"),
        (_compiled_in_place, "Sequential.compile() on the model"),
        (_submodule_compiled_in_place, "module.compile() on submodule '2.0' (the regional form)"),
        (_submodule_wrapped, "torch.compile(...) of submodule '2' (the regional form)"),
    ],
    ids=["torch.compile(model)", "model.compile()", "submodule.compile()", "torch.compile(submodule)"],
)
def test_each_compiled_form_is_refused_by_the_session_before_anything_runs(make, form):
    model = make()
    session = OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu")
    with pytest.raises(CompiledModelError) as raised, session.step(model):
        model(torch.randn(2, 8))
    message = str(raised.value)
    assert f"found {form}" in message
    assert "regional form" in message and "module.compile()" in message  # the same message every time
    assert not session.engine.step_open
    session.close()
