"""``accudnn plan`` states the route a model's plan takes, and refuses a model compiled whole."""

from __future__ import annotations

import json

import pytest
from torch import nn

from lightning_accudnn.cli import main
from lightning_accudnn.planner.plan import ROUTE_EAGER, ROUTE_REGIONAL

ARGS = ["--input-shape", "64", "--batch-size", "8", "--gpu", "l4", "--budget", "1GB", "--min-swap-bytes", "0"]


def mlp() -> nn.Module:
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3)))


def regional_mlp() -> nn.Module:
    model = mlp()
    for block in model:
        block.compile(backend="eager")
    return model


def whole_mlp() -> nn.Module:
    model = mlp()
    model.compile(backend="eager")
    return model


@pytest.mark.parametrize(("factory", "route"), [("mlp", ROUTE_EAGER), ("regional_mlp", ROUTE_REGIONAL)])
def test_the_plan_states_the_models_route(factory, route, capsys):
    assert main(["plan", f"tests.cli.test_cli_route:{factory}", *ARGS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["route"] == route
    assert main(["plan", f"tests.cli.test_cli_route:{factory}", *ARGS]) == 0
    assert f"route: {route}" in capsys.readouterr().out


def test_a_model_compiled_whole_is_refused_naming_the_regional_form_and_the_experimental_option(capsys):
    assert main(["plan", "tests.cli.test_cli_route:whole_mlp", *ARGS]) == 2
    error = capsys.readouterr().err
    assert "compiled whole (Sequential.compile() on the model)" in error
    assert "compile its blocks one by one" in error and "whole_model_compile='experimental'" in error
