"""On a CUDA GPU: the working memory hooked passes measure from the caching allocator puts the
predicted peak at the allocator's, never below it, and a budget the saves alone would fit but the
working memory would not is met by the plan, without a pass going past its room."""

import pytest
import torch
from torch import nn

from lightning_accudnn.session import OffloadConfig, OffloadSession

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("deterministic_cuda")]

BATCH, WIDTH, CLASSES, DEPTH = 4096, 256, 8192, 6  # the loss's logits: 128 MB in float32


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES)).to(device)


def _train(budget, steps, min_swap_bytes=0):
    """Per planned step: (allocated peak, predicted peak, usable bytes, reserve); and the plan."""
    device = torch.device("cuda")
    model = _model(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = OffloadConfig(budget=budget, min_swap_bytes=min_swap_bytes, plan_in_background=False)
    session = OffloadSession(config, device)
    generator = torch.Generator(device=device).manual_seed(1)
    seen = []
    for _ in range(steps):
        inputs = torch.randn(BATCH, WIDTH, device=device, generator=generator)
        targets = torch.randint(0, CLASSES, (BATCH,), device=device, generator=generator)
        with session.step(model, optimizer):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        stats = session.stats
        if stats.predicted_peak_bytes is not None:
            seen.append(
                (
                    stats.peak_device_bytes,
                    stats.predicted_peak_bytes,
                    session.headroom.usable_bytes,
                    session.reserve_bytes,
                )
            )
    plan = session.plan
    session.close()
    return seen, plan


def test_the_predicted_peak_is_the_allocators_with_everything_kept():
    seen, plan = _train("90%", steps=6, min_swap_bytes=2**40)
    assert plan.swapped_bytes == 0 and not plan.recomputed
    measured, predicted, _, _ = seen[-1]
    assert measured > plan.profile.static_bytes + plan.profile.saved_bytes + 2 * BATCH * CLASSES * 4
    assert all(peak <= prediction for peak, prediction, _, _ in seen[1:])
    assert predicted <= 1.05 * measured


def test_a_budget_the_saves_fit_but_the_working_memory_does_not_is_met_by_the_plan():
    kept, plan = _train("90%", steps=4)
    reserve = 2**28  # the default reserve of the budgets below
    ledger_need = plan.profile.static_bytes + plan.profile.saved_bytes + reserve
    allocated_need = kept[-1][0] + reserve
    # The smallest budget holds the profiling pass, whose working memory (the loss's logits, their
    # log-softmax and gradient) no swapping lowers.
    smallest = plan.min_budget_bytes - plan.reserve_bytes + reserve
    budget = (max(ledger_need, smallest) + allocated_need) // 2
    assert ledger_need < budget < allocated_need
    seen, plan = _train(budget, steps=8)
    assert plan.swapped_bytes > 0 or plan.recomputed
    reserves = {reserve for _, _, _, reserve in seen}
    assert len(reserves) == 1, "a pass went past its room: the plan did not count the working memory"
    for peak, _, usable, _ in seen:
        assert peak <= usable
    assert seen[-1][0] <= seen[-1][1]
