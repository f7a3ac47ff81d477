"""Selective recomputation: the expensive ops' outputs kept, the cheap ops run again, bit for bit.

Policy ``"selective"`` keeps each layer or recomputes its segment selectively (matrix products,
convolutions and attention kept; normalisation, activations, dropout and residual adds run
again in backward). Training under it equals plain training in every bit (dropout reproduced,
BatchNorm statistics updated once), every pass stays within the budget, and the plan's predicted
peak is never below the engine's ledger.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from lightning_accudnn import OffloadConfig, OffloadSession
from lightning_accudnn.ops.recompute import SegmentProbe, SegmentRecomputer
from lightning_accudnn.planner.plan import min_budget_bytes, plan_swaps
from lightning_accudnn.planner.recompute import candidate_spans, recomputed_profile
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
from lightning_accudnn.session.recompute_pass import departs_from_plan
from tests.recompute.training import measured_profile, plain, train


@pytest.mark.parametrize("kind", ["resnet", "gpt"])
def test_selectively_recomputed_training_is_bitwise_plain_training(kind):
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="selective")
    profile = measured_profile(kind, config)
    assert all(segment.selective_kept_bytes is not None for segment in profile.segments)
    budget = min_budget_bytes(profile, policy="selective")
    assert budget < profile.unconstrained_peak_bytes
    expected = plain(kind)
    record, plans, hooked, peaks, _ = train(kind, config.replace(budget=budget))
    for step, (got, want) in enumerate(zip(record, expected, strict=True)):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (kind, step, name)
    final = plans[-1]
    assert final is not None and final.selective and set(final.selective) == set(final.recomputed)
    assert not final.swapped_layers
    assert all(peak <= budget for _, peak in peaks), (peaks, budget)
    # The prediction is never below what the engine's ledger measured under the plan.
    assert all(peak <= final.predicted_peak_bytes for planned, peak in peaks if not planned)
    # The engine saw the kept outputs inside the segments, as the plan expects: no re-profiling.
    assert hooked[-2:] == [0, 0], hooked


class _Block(nn.Module):
    """A linear layer, then cheap ops (GELU, dropout, a residual add), then another linear layer."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.drop = nn.Dropout(0.25)
        self.down = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(self.drop(torch.nn.functional.gelu(self.up(x)))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(_Block(), _Block(), nn.Linear(16, 1))


class _Held:
    """Saved-tensor hooks that count the distinct storages saved (parameters' aside), as the
    engine's ledger does."""

    def __init__(self, model: nn.Module) -> None:
        self.storages: dict[int, torch.Tensor] = {}
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in self.params:
            self.storages.setdefault(tensor.untyped_storage().data_ptr(), tensor)
        return tensor

    @property
    def nbytes(self) -> int:
        return sum(tensor.untyped_storage().nbytes() for tensor in self.storages.values())


def _held_bytes(model: nn.Module, x: torch.Tensor, recomputer: SegmentRecomputer | None) -> int:
    held = _Held(model)
    with torch.autograd.graph.saved_tensors_hooks(held.pack, lambda tensor: tensor):
        if recomputer is not None:
            with recomputer.enabled_for_pass():
                loss = model(x).sum()
        else:
            loss = model(x).sum()
    nbytes = held.nbytes
    loss.backward()
    return nbytes


def test_the_selective_choice_frees_the_cheap_ops_bytes():
    """The probe's figures are what selective recomputation holds: a segment's inputs and its
    linear layers' outputs pass to the hooks in force; what dropout, the residual add and
    LayerNorm save (the probe's ``selective_recomputed_bytes``) is no longer held. (GELU saves
    its input, the first linear layer's output: kept; the second linear layer's output is kept
    though plain training saves it nowhere.)"""
    model = _model()
    x = torch.randn(32, 16)
    probe = SegmentProbe()
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor):
        probe.attach(model, selective=True)
        model(x).sum().backward()
        probe.finish_forward()
    probe.detach()
    segments = {segment.name: segment for segment in probe.segments()}
    assert set(segments) == {"0", "1"}
    rows, width = 32, 16
    for segment in segments.values():  # up (4 wide) and down (1 wide), float32
        assert segment.selective_kept_bytes == rows * (4 * width + width) * 4
        assert segment.selective_recomputed_bytes is not None and segment.selective_recomputed_bytes > 0
        assert 0.0 < segment.selective_recompute_share < 1.0
    plain_held = _held_bytes(model, x, None)
    recomputer = SegmentRecomputer()
    recomputer.install(model, [], selective=["0", "1"])
    selective_held = _held_bytes(model, x, recomputer)
    recomputer.install(model, ["0", "1"])
    whole_held = _held_bytes(model, x, recomputer)
    recomputer.remove()
    kept = sum(segment.selective_kept_bytes or 0 for segment in segments.values())
    freed = sum(segment.selective_recomputed_bytes or 0 for segment in segments.values())
    assert whole_held < selective_held < plain_held
    up_outputs = 2 * rows * 4 * width * 4
    assert selective_held == whole_held + kept
    assert plain_held == whole_held + freed + up_outputs


def test_dropout_under_selective_recomputation_replays_the_same_numbers():
    """A segment whose dropout runs again in backward: the gradients equal plain training's,
    so the recomputed mask is the forward's (and the kept linear outputs are not rebuilt)."""
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(32, 16)
    torch.manual_seed(5)
    model(x).square().sum().backward()
    recomputer = SegmentRecomputer()
    recomputer.install(twin, [], selective=["0", "1"])
    torch.manual_seed(5)
    with recomputer.enabled_for_pass():
        loss = twin(x).square().sum()
    torch.manual_seed(99)  # the RNG moves on before backward: the replay must not follow it
    loss.backward()
    for (name, ours), theirs in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(ours.grad, theirs.grad), name


def test_selective_accounting_holds_the_kept_bytes_and_rebuilds_the_cheap_saves():
    layers = (
        LayerProfile("stem", 40, 40, 1.0, 2.0),
        LayerProfile("block.fc", 100, 100, 3.0, 6.0),
        LayerProfile("block.act", 100, 100, 1.0, 2.0),
        LayerProfile("head", 10, 10, 0.1, 0.2),
    )
    segment = SegmentProfile(
        "block", 40, selective_kept_bytes=100, selective_recompute_share=0.25, selective_recomputed_bytes=100
    )
    profile = StepProfile(layers, 0, segments=(segment,))
    (span,) = candidate_spans(profile, selective=True)
    assert (span.held_bytes, span.freed_bytes, span.recompute_seconds) == (140, 60, 1.0)
    step = recomputed_profile(profile, (span,), swappable=False)
    block = step.profile.layers[1]
    assert (block.name, block.saved_bytes, block.backward_seconds) == ("block", 140, 8.0 + 1.0)
    assert step.transient_bytes == (0, 100, 0) and step.selective == ("block",)
    assert step.recompute_seconds == 1.0
    # Not measured: never recomputed selectively.
    assert (
        candidate_spans(StepProfile(layers, 0, segments=(SegmentProfile("block", 40),)), selective=True) == ()
    )


def test_a_selective_plan_recomputes_less_time_than_a_whole_one_at_the_same_budget():
    layers = tuple(
        LayerProfile(f"b{i}.{op}", saved, saved, seconds, 2 * seconds)
        for i in range(3)
        for op, saved, seconds in (("fc", 100, 3e-3), ("act", 200, 1e-3))
    )
    segments = tuple(
        SegmentProfile(f"b{i}", 50, 50, selective_kept_bytes=100, selective_recompute_share=0.25)
        for i in range(3)
    )
    profile = StepProfile(layers, 1_000, segments=segments)
    budget = 1_000 + 700
    selective = plan_swaps(profile, budget, policy="selective")
    whole = plan_swaps(profile, budget, policy="recompute")
    assert selective.selective and selective.recomputed == selective.selective
    assert not whole.selective
    assert selective.predicted_peak_bytes <= budget
    assert selective.recompute_seconds < whole.recompute_seconds
    assert selective.predicted_step_seconds < whole.predicted_step_seconds


def test_the_engine_s_saves_inside_a_selective_segment_count_as_the_segment_s():
    layers = tuple(
        LayerProfile(f"{block}.{op}", 100, 100, 1e-3, 2e-3) for block in ("one", "two") for op in "ab"
    )
    segments = tuple(
        SegmentProfile(name, 10, selective_kept_bytes=50, selective_recomputed_bytes=100)
        for name in ("one", "two")
    )
    plan = plan_swaps(StepProfile(layers, 0, segments=segments), 300, policy="selective")
    (chosen,) = plan.selective

    def measured(kept_inside: int) -> StepProfile:
        seen: list[LayerProfile] = []
        for block in ("one", "two"):
            if block == chosen:  # its inputs, then what its expensive op keeps, saved inside it
                seen += [LayerProfile(block, 10, 10), LayerProfile(f"{block}.a", kept_inside, kept_inside)]
            else:  # less than the plan counts: the total alone would not show the segment's excess
                seen += [LayerProfile(f"{block}.{op}", 90, 90) for op in "ab"]
        return StepProfile(tuple(seen), 0)

    assert not departs_from_plan(plan, measured(50))
    assert departs_from_plan(plan, measured(51))


@pytest.mark.parametrize("lag", [0, None])
def test_selective_recomputation_on_a_simulated_gpu_keeps_order_and_the_budget(lag):
    """The dropout GPT under a selective plan on a simulated GPU capped at what the budget
    leaves beside the model state: the kept outputs pass through the engine's hooks from inside
    selective checkpointing; no out-of-memory, no stream-order violation, bitwise plain training."""
    from lightning_accudnn.testing import SimulatedGPU

    reserve = 16 * 1024  # the allocator rounds blocks to 512 bytes: the reserve covers it
    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=reserve, policy="selective")
    profile = measured_profile("gpt", config, runtime=SimulatedGPU(lag=lag))
    budget = min_budget_bytes(profile, reserve, policy="selective")
    assert budget < profile.unconstrained_peak_bytes + reserve
    gpu = SimulatedGPU(lag=lag, capacity_bytes=budget - profile.static_bytes)
    expected = plain("gpt")
    record, plans, _, peaks, _ = train("gpt", config.replace(budget=budget), runtime=gpu)
    for got, want in zip(record, expected, strict=True):
        assert all(torch.equal(got[name], want[name]) for name in want)
    assert plans[-1].selective
    assert gpu.violations == [] and gpu.num_ooms == 0
    assert all(peak <= budget for _, peak in peaks)


def test_policy_selective_without_a_measured_segment_is_refused_naming_why():
    from lightning_accudnn.planner.plan import NothingToRecomputeError
    from lightning_accudnn.profile import ExcludedSegment

    layers = (LayerProfile("block.fc", 100, 100), LayerProfile("block.act", 100, 100))
    excluded = (ExcludedSegment("block", "not recomputed selectively: aten.relu_ writes in place"),)
    profile = StepProfile(layers, 0, segments=(SegmentProfile("block", 10),), excluded_segments=excluded)
    with pytest.raises(NothingToRecomputeError, match="aten.relu_ writes in place"):
        plan_swaps(profile, 1_000, policy="selective")
    plan_swaps(profile, 1_000, policy="recompute")  # the segment is still recomputed whole


def test_the_trace_and_a_live_profiling_pass_measure_the_same_selective_bytes():
    """The dry-run trace (fake tensors) and the probe of a live run count the same kept and
    rebuilt bytes for each segment (float32, no dropout: the CPU and the trace save alike)."""
    from lightning_accudnn.ops.layers import LayerTracker
    from lightning_accudnn.profiling.trace import trace_step

    def build() -> nn.Module:
        torch.manual_seed(0)
        blocks = [_Block(), _Block()]
        for block in blocks:
            block.drop.p = 0.0
        return nn.Sequential(*blocks, nn.Linear(16, 1))

    traced = {
        segment.name: segment for segment in trace_step(build, (32, 16), tracker=LayerTracker()).segments
    }
    model = build()
    probe = SegmentProbe()
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor):
        probe.attach(model, selective=True)
        model(torch.zeros(32, 16)).sum().backward()
        probe.finish_forward()
    probe.detach()
    live = {segment.name: segment for segment in probe.segments()}
    assert set(live) == set(traced) == {"0", "1"}
    for name, segment in live.items():
        assert segment.selective_kept_bytes == traced[name].selective_kept_bytes
        assert segment.selective_recomputed_bytes == traced[name].selective_recomputed_bytes


def test_lightning_trains_under_policy_selective_as_plain_lightning():
    """``AccUDNNStrategy(policy="selective")`` at the least budget that policy names: the weights
    equal plain Lightning's bit for bit (dropout in every block)."""
    import warnings

    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader

    from lightning_accudnn import AccUDNNStrategy
    from tests.recompute.models import batch, build, loss_of

    class Net(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = build("gpt")

        def training_step(self, step_batch, batch_index):
            inputs, targets = step_batch
            return loss_of(self.model, inputs[0], targets[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def fit(strategy) -> Net:
        torch.manual_seed(0)
        net = Net()
        data = DataLoader([batch("gpt", step) for step in range(4)], batch_size=1)
        trainer = Trainer(
            accelerator="cpu",
            devices=1,
            strategy=strategy,
            max_steps=4,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(net, data)
        return net

    config = OffloadConfig(budget=10**9, min_swap_bytes=0, reserve_bytes=0, policy="selective")
    budget = min_budget_bytes(measured_profile("gpt", config), policy="selective")
    plain_net = fit("auto")
    strategy = AccUDNNStrategy(budget=budget, min_swap_bytes=0, reserve_bytes=0, policy="selective")
    offloaded = fit(strategy)
    for (name, want), got in zip(
        plain_net.state_dict().items(), offloaded.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name
    assert strategy.plan is not None and strategy.plan.selective


def test_selective_recomputation_under_bf16_autocast_is_bitwise_plain_training():
    """Under CPU autocast the kept matrix products are bfloat16 and the casts are recomputed."""
    from tests.recompute.models import batch, build, loss_of
    from tests.recompute.sweep import Workload, sweep_selective

    def loss(model: nn.Module, step_batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_of(model, *step_batch)

    outcome = sweep_selective(Workload(lambda: build("gpt"), lambda step: batch("gpt", step), loss))
    assert outcome.plan.selective


class _ResidualMlps(nn.Module):
    """Two ``x + mlp(x)`` after a linear layer, the additions outside the ``mlp`` segments: the
    last linear layer of each writes an output no backward in its segment reads."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.first = nn.Linear(width, width)
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(2)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for mlp in self.mlps:
            x = x + mlp(x)
        return self.head(x)


def test_a_kept_output_no_backward_reads_is_let_go_with_its_segment():
    """Selective checkpointing hands a kept output back (through the engine's unpack) only when
    the recomputation reaches its op; one that stopped at the last save it rebuilds left the
    output of each ``mlp``'s last linear layer counted by the engine until the step ended."""
    torch.manual_seed(0)
    model = _ResidualMlps()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(4, 8, 16) for _ in range(2)]

    def run(budget: int, steps: int) -> tuple[OffloadSession, list[int]]:
        session = OffloadSession(
            OffloadConfig(
                budget=budget, min_swap_bytes=0, reserve_bytes=0, policy="selective", plan_in_background=False
            ),
            "cpu",
        )
        counted: list[int] = []
        first = model.first.weight  # its gradient is the backward's last
        hook = first.register_post_accumulate_grad_hook(
            lambda _: counted.append(session.engine.ledger.activation_bytes)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the host-copy backend's CPU warning
            for step in range(steps):
                with session.step(model, [optimizer]):
                    loss = model(batches[step % 2]).square().mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        hook.remove()
        session.close()
        return session, counted

    ample, _ = run(10**9, 2)
    assert ample.plan is not None
    session, counted = run(ample.plan.min_budget_bytes, 6)
    assert session.plan is not None and set(session.plan.selective) == {"mlps.0", "mlps.1"}
    # Once the first layer has its gradient, the engine counts at most the batch it saved (held
    # beyond the forward, let go when the step ends).
    assert all(nbytes <= batches[0].nbytes for nbytes in counted), counted
