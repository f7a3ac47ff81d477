"""A refusal the session catches leaves no garbage that holds the step's tensors.

A batch shape not seen before is first planned from a scaled profile of another shape; when no
plan fits that profile, the planner's refusal is caught and the shape profiles instead. The
refusal, raised from the planning call, held that call's frame in its traceback, and the frame a
local holding the refusal: a reference cycle, which kept every frame up to the model's forward
(the batch, the model's output) alive until Python's cyclic collector ran. Those bytes then
counted in the profiling pass's peak, and in whatever ran beside them.
"""

from __future__ import annotations

import gc

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session.plan_book import PlanSource
from lightning_accudnn.testing import OpBytesAllocator


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 10))


def _cyclic_garbage() -> list[object]:
    """What a full collection finds unreachable now (kept for inspection, then let go)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    return garbage


def _of_a_step(item: object) -> bool:
    """Whether ``item`` is a tensor or an error a training step could leave: not a fake tensor,
    which no training step makes (tracing and compilation do). Fake tensors of an earlier test
    on the same worker turned up in this test's garbage once, in a fresh-clone CI run."""
    return isinstance(item, torch.Tensor | BaseException) and not isinstance(item, FakeTensor)


def test_a_caught_refusal_of_a_scaled_plan_leaves_no_tensor_in_cyclic_garbage():
    """Batches of 16, then 34: the 34-row shape's profile scaled from the 16-row one fits no plan
    under the budget, so it profiles. With the cyclic collector off (as between its runs), no
    step leaves a tensor or an error behind in garbage."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    allocator = OpBytesAllocator(base_bytes=model_state_bytes(model, [optimizer]) - parameters)
    config = OffloadConfig(
        plan_in_background=False, budget=44_000, min_swap_bytes=0, reserve_bytes=0, policy="swap"
    )
    session = OffloadSession(config, "cpu", allocator=allocator)
    sources = []
    gc.collect()
    gc.disable()
    try:
        for step, size in enumerate([16, 34, 34]):
            generator = torch.Generator().manual_seed(step)
            with allocator.counting():
                inputs = torch.randn(size, 16, generator=generator)
                with session.step(model, optimizer):
                    loss = model(inputs).square().mean()
                loss.backward()
                del inputs, loss
            optimizer.step()
            optimizer.zero_grad()
            sources.append(session.stats.plan_source)
            garbage = _cyclic_garbage()
            left = [type(item).__name__ for item in garbage if _of_a_step(item)]
            del garbage
            assert not left, (step, left)
    finally:
        gc.enable()
        session.close()
    # the second shape was profiled: its scaled plan was refused (caught), as the test means
    assert sources == [PlanSource.PROFILING, PlanSource.PROFILING, PlanSource.PROFILED]
