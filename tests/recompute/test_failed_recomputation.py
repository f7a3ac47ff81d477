"""A recomputation that fails in backward anyway loses nothing.

The segment here saves one more tensor when it is recomputed than when it was called (nothing
the profiling pass can see), so checkpointing raises in backward. The step is aborted before
the optimizer steps, the segment is excluded and the step re-planned and run again: the fit
equals plain training, bitwise, and one warning names the segment.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_accudnn import AccUDNNStrategy, NothingToRecomputeError, OffloadConfig, OffloadSession
from lightning_accudnn.ops.errors import RecomputationError
from lightning_accudnn.ops.recompute import is_recomputing
from tests.recompute.models import slow_link

WIDTH, STEPS, BATCH = 32, 4, 256


class Flaky(nn.Module):
    """Saves one more tensor when recomputed (``x * ones`` saves ``ones``), same values."""

    def __init__(self) -> None:
        super().__init__()
        self.widen, self.narrow = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.widen(x))
        if is_recomputing():
            x = x * torch.ones_like(x)
        return self.narrow(torch.tanh(torch.tanh(x)))


def _block() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.Tanh(), nn.Linear(4 * WIDTH, WIDTH))


class Net(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem, self.flaky, self.middle, self.last = _block(), Flaky(), _block(), _block()
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.last(self.middle(self.flaky(self.stem(x)))))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return F.cross_entropy(self(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs, targets = (
        torch.randn(STEPS * BATCH, WIDTH, generator=generator),
        torch.randint(0, 4, (STEPS * BATCH,)),
    )
    return DataLoader(TensorDataset(inputs, targets), batch_size=BATCH)


def _fit(strategy: AccUDNNStrategy | str) -> Net:
    model = Net()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, _data())
    return model


def _least_recompute_budget() -> int:
    """The least budget at which keeping or recomputing fits (``flaky`` recomputed among others)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(
            OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="recompute"), "cpu"
        )
    model = Net()
    optimizer = model.configure_optimizers()
    for batch in list(_data())[:2]:
        with session.step(model, optimizer):
            loss = model.training_step(batch, 0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    session.close()
    plan = session.plan
    assert plan is not None and "flaky" in {segment.name for segment in plan.profile.segments}
    return plan.min_budget_bytes


def test_a_failed_recomputation_is_rerun_without_the_segment_and_the_fit_equals_plain_training(
    caplog, monkeypatch
):
    """Under ``auto`` with a slow host link the plan recomputes ``flaky``; once it fails, the
    step is re-planned to swap instead."""
    plain = _fit("auto")
    slow_link(monkeypatch)
    strategy = AccUDNNStrategy(budget=_least_recompute_budget(), min_swap_bytes=0, reserve_bytes=0)
    with caplog.at_level(logging.WARNING, logger="lightning_accudnn"):
        offloaded = _fit(strategy)
    for (name, want), got in zip(plain.state_dict().items(), offloaded.state_dict().values(), strict=True):
        assert torch.equal(got, want), name
    warned = [record for record in caplog.records if "'flaky'" in record.getMessage()]
    assert len(warned) == 1, [record.getMessage() for record in caplog.records]
    plan = strategy.plan
    assert plan is not None and "flaky" not in plan.recomputed
    assert [entry.name for entry in plan.profile.excluded_segments] == ["flaky"]


def test_without_a_retry_the_error_names_the_segment_and_later_plans_leave_it_out(monkeypatch):
    """A plain loop cannot run the step again: the error names the segment and the fix, and
    ``session.abort(error)`` plans without the segment."""
    slow_link(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = OffloadSession(
            OffloadConfig(budget=_least_recompute_budget(), min_swap_bytes=0, reserve_bytes=0),
            "cpu",
        )
    model = Net()
    optimizer = model.configure_optimizers()
    failed = None
    for batch in list(_data())[:3]:
        with session.step(model, optimizer):
            loss = model.training_step(batch, 0)
        try:
            loss.backward()
        except Exception as error:
            failed = session.abort(error)
            optimizer.zero_grad()
            continue
        optimizer.step()
        optimizer.zero_grad()
    assert isinstance(failed, RecomputationError) and failed.segment == "flaky"
    assert "keep_on_device=['flaky']" in str(failed)
    assert session.plan is not None and "flaky" not in session.plan.recomputed
    session.close()


class Counted(nn.Module):
    """Counts its calls: a per-call side effect, which no recomputation may repeat."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


class Counting(Net):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Counted(nn.Linear(WIDTH, WIDTH)), Counted(nn.Linear(WIDTH, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def test_policy_recompute_with_no_safe_segment_is_refused_before_any_weight_changes():
    model = Counting()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trainer = Trainer(
        accelerator="cpu",
        strategy=AccUDNNStrategy(budget=10**8, policy="recompute", min_swap_bytes=0),
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    with pytest.raises(NothingToRecomputeError, match="first: calling it changes Counted.calls"):
        trainer.fit(model, _data())
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
