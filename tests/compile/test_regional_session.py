"""Regional compilation under OffloadSession: bitwise-equal gradients with swapping forced, one
layer per compiled block, and each block compiled once over hooked and replayed passes."""

from __future__ import annotations

import pytest
import torch

from lightning_accudnn.planner.plan import ROUTE_REGIONAL
from lightning_accudnn.profile import ROOT_LAYER
from lightning_accudnn.session import OffloadConfig, OffloadSession
from tests.compile.helpers import (
    BACKENDS,
    FORMS,
    CompileCounts,
    assert_bitwise_equal,
    backend_param,
    compiled_net,
    tight_budget,
    train_in,
    train_plain,
)

STEPS = 4  # a profiling pass, the refining pass, then passes replayed by ordinal


def train_in_session(model, budget: int, steps: int = STEPS):
    # Policy swap: the compiled blocks are recompute candidates too, and auto's choice between
    # swapping and recomputing them follows measured timings (test_regional_recompute.py forces it).
    config = OffloadConfig(budget=budget, min_swap_bytes=0, policy="swap")
    session = OffloadSession(config, "cpu", report=lambda line: None)
    swapped: list[int] = []

    def note_swapped() -> None:
        swapped.append(session.stats.bytes_swapped_out)

    grads = train_in(session, model, steps, after_backward=note_swapped)
    session.close()
    return session, grads, swapped


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", [backend_param(backend) for backend in BACKENDS])
def test_regional_compile_trains_bitwise_equal_with_one_layer_per_block_compiled_once(backend, form):
    torch._dynamo.reset()
    result = {}

    def run() -> None:
        budget = tight_budget(compiled_net(backend, form))
        result["session"] = train_in_session(compiled_net(backend, form), budget)
        result["plain"] = train_plain(compiled_net(backend, form), STEPS)

    counts = CompileCounts.during(run)
    session, grads, swapped = result["session"]
    expected = result["plain"]

    assert_bitwise_equal(expected, grads)
    assert all(nbytes > 0 for nbytes in swapped), f"every pass should swap: {swapped}"
    # The two blocks are alike, so Dynamo compiles one frame for both (parameters are graph
    # inputs), once in all: the hooked passes (budget measurement, profiling, refining), the
    # passes replayed by ordinal and the plain model without the session run the same code.
    assert counts == CompileCounts(frames=1, graphs=1, graph_breaks=0), counts
    layers = [layer.name for layer in session.plan.profile.layers]
    assert {"blocks.0", "blocks.1"} <= set(layers), layers
    own_code = {ROOT_LAYER, f"{ROOT_LAYER}#2"}  # after the stem, and for the loss
    assert set(layers) <= {*own_code, "stem", "blocks.0", "blocks.1", "head"}, layers  # none inside a block
    assert session.plan.swapped_layers & {"blocks.0", "blocks.1"}, "the plan should swap a compiled block"
    assert session.plan.route == ROUTE_REGIONAL and f"route: {ROUTE_REGIONAL}" in str(session.plan)
