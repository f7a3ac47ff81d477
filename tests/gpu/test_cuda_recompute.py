"""On a CUDA GPU: whole segments recomputed through the lean checkpoint train bitwise like the
plain loop, with CUDA dropout (its device RNG state replayed) and bf16 CUDA autocast (its state
replayed), in a session whose steady passes run without the engine's hooks."""

import copy
import warnings

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.ops import recompute as recompute_module
from lightning_accudnn.planner import plan as planner_plan
from tests.recompute.models import batch, build, forcing_search, loss_of

pytestmark = pytest.mark.cuda

STEPS = 6


@pytest.fixture(autouse=True)
def deterministic_cuda():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    yield
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    ("kind", "names"), [("resnet", ("blocks.0", "blocks.2")), ("gpt", ("blocks.0", "blocks.1.mlp"))]
)
@pytest.mark.parametrize("autocast", [False, True])
def test_lean_recomputation_trains_bitwise_on_cuda(kind, names, autocast, monkeypatch):
    def torch_checkpoint(*args, **kwargs):
        raise AssertionError("a whole segment took torch.utils.checkpoint, not the lean checkpoint")

    monkeypatch.setattr(recompute_module, "checkpoint", torch_checkpoint)
    monkeypatch.setattr(planner_plan, "search_mixed", forcing_search(names))
    device = torch.device("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = OffloadConfig(
            budget=10**10, min_swap_bytes=0, reserve_bytes=0, policy="recompute", observe_every=2
        )
        session = OffloadSession(config, device)
    model = build(kind).to(device)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    planned = 0
    for step in range(STEPS):
        inputs, targets = (tensor.to(device) for tensor in batch(kind, step))
        torch.manual_seed(step)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast), session.step(model, optimizer):
            loss = loss_of(model, inputs, targets)
        loss.backward()
        torch.manual_seed(step)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            reference_loss = loss_of(reference, inputs, targets)
        reference_loss.backward()
        assert torch.equal(loss, reference_loss), step
        for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), (step, name)
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
        assert session.stats is not None
        if not session.stats.profiling:
            assert session.plan is not None and sorted(session.plan.recomputed) == sorted(names)
            planned += 1
    session.close()
    assert planned >= STEPS - 2
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
