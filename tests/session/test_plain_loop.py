"""OffloadSession from a plain PyTorch loop: the step closes itself at the end of backward,
profiles, plans, plans a new batch shape from the scaled profile (then refines it), and trains
bitwise like the loop without it."""

import copy
import warnings

import pytest
import torch

from lightning_accudnn import OffloadConfig, OffloadSession
from tests.models import SmallResNet, loss_of, make_batch
from tests.session.helpers import memory_need, sgd


def test_plain_loop_profiles_plans_scales_a_new_batch_shape_and_matches_plain_training_bitwise():
    torch.manual_seed(0)
    model = SmallResNet()
    reference = copy.deepcopy(model)
    optimizer, reference_optimizer = sgd(model), sgd(reference)
    static, saved = memory_need(copy.deepcopy(model), sgd(copy.deepcopy(model)), "cnn")
    budget = static + int(0.3 * saved)  # the batch of 3 (under half of 8) must swap too
    assert static + saved > budget  # without swapping the step would not fit

    # Policy "swap": recomputation alone would fit this budget, and the test is of swapping.
    # Plans made at the end of their pass: which plan each pass runs is what is checked.
    config = OffloadConfig(budget=budget, min_swap_bytes=0, policy="swap", plan_in_background=False)
    session = OffloadSession(config, torch.device("cpu"))
    sizes = [8, 8, 8, 3, 3, 8]  # 3 is under half of 8: its own plan (scaled), not 8's plan reused
    stats, plans = [], []
    for index, size in enumerate(sizes):
        batch = make_batch("cnn", size, seed=index)
        with session.step(model, optimizer):
            loss = loss_of(model, batch)
        loss.backward()  # closes the step: no call to the session after it
        stats.append(session.stats)
        plans.append(session.plan)
        loss_of(reference, batch).backward()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), f"step {index}: gradients differ"
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
    session.close()

    assert [s.profiling for s in stats] == [True, False, False, False, False, False]
    sources = [s.plan_source.value for s in stats]
    assert sources == ["profiling", "profiled", "refined", "scaled", "refined", "refined"]
    assert all(s.bytes_swapped_out > 0 for s in stats)
    assert all(s.peak_device_bytes <= budget for s in stats)
    big, small = plans[2], plans[4]
    assert big.swapped_layers and big.profile.saved_bytes > 1.9 * small.profile.saved_bytes
    assert plans[5] is big  # batch size 8 again: its plan is found again, not re-profiled
    assert session.engine.pool.in_use_bytes == 0
    for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_explicit_batch_and_explicit_close_and_a_model_not_called_is_an_error():
    model = SmallResNet()
    optimizer = sgd(model)
    with OffloadSession(OffloadConfig(budget="1GB", min_swap_bytes=0), "cpu") as session:
        batch = make_batch("cnn", 4)
        with session.step(model, optimizer, batch=batch, close_on_backward=False):
            loss = loss_of(model, batch)
        session.begin_backward()
        loss.backward()
        assert session.stats is None  # nothing closed the pass yet
        assert session.end_backward().profiling
        assert session.end_backward() is None  # nothing open any more

        with pytest.raises(RuntimeError, match="not called inside the block"), session.step(model, optimizer):
            pass


def test_session_for_cuda_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    with pytest.raises(RuntimeError, match="no CUDA device is available"):
        OffloadSession(OffloadConfig(), "cuda")


def test_a_model_with_lazy_modules_not_run_yet_is_refused_with_what_to_do():
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(OffloadConfig(budget=10**8, min_swap_bytes=0), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    refused = pytest.raises(ValueError, match=r"lazy modules: 0\.weight, 0\.bias.*Run one forward pass")
    with refused, session.step(model, optimizer):
        model(torch.randn(4, 3))
    with torch.no_grad():
        model(torch.randn(4, 3))  # the shapes are known now
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        with session.step(model, optimizer):
            loss = model(torch.randn(4, 3)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert session.plan is not None
    session.close()
