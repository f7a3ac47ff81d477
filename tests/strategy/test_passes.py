"""Each distinct pass of a training step keeps its own plan (manual optimization, a GAN), and
keep_on_device patterns that match no module are refused before training."""

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule
from torch import nn

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from lightning_accudnn.profiling.static_memory import model_state_bytes
from lightning_accudnn.session import UnmatchedPatternError
from lightning_accudnn.session.steady_costs import STEADY_TIMED_PASSES
from lightning_accudnn.session.warm_times import TIMED_PLANNED_PASSES
from tests.models import Classifier, loader
from tests.strategy.helpers import StatsRecorder, trainer_for


class TinyGAN(LightningModule):
    """Two optimizers, two different graphs per step: the generator's pass runs both networks,
    the discriminator's runs the discriminator twice on a generator output made without grad."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(3 * 16 * 16, 1024), nn.ReLU(), nn.Linear(1024, 3 * 16 * 16))
        self.discriminator = nn.Sequential(nn.Linear(3 * 16 * 16, 512), nn.LeakyReLU(0.2), nn.Linear(512, 1))

    def training_step(self, batch, batch_idx):
        images, _ = batch
        real = images.flatten(1)
        noise = torch.roll(real, shifts=1, dims=0)
        g_opt, d_opt = self.optimizers()

        g_loss = F.softplus(-self.discriminator(self.generator(noise))).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()

        with torch.no_grad():
            fake = self.generator(noise)
        d_loss = F.softplus(self.discriminator(fake)).mean() + F.softplus(-self.discriminator(real)).mean()
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()

    def configure_optimizers(self):
        return (
            torch.optim.Adam(self.generator.parameters(), lr=1e-3),
            torch.optim.SGD(self.discriminator.parameters(), lr=0.05, momentum=0.9),
        )


def _gan_budget(gan: TinyGAN) -> int:
    """Model state plus what the generator's pass saves less a fifth of what it can swap (not the
    noise, which the step holds throughout): it must swap."""
    static = model_state_bytes(gan, gan.configure_optimizers())
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    noise = next(iter(loader("cnn")))[0].flatten(1)
    with engine.offload(gan, SwapSchedule.swap_everything(max_copying_out_bytes=0)):
        loss = gan.discriminator(gan.generator(noise)).mean()
    loss.backward()
    gan.zero_grad(set_to_none=True)
    layers = engine.end_step().layers
    saved = sum(layer.saved_bytes for layer in layers)
    swappable = sum(layer.swappable_bytes for layer in layers)
    return static + saved - swappable // 5


def test_two_optimizer_gan_plans_once_per_distinct_pass_and_trains_like_plain_lightning(caplog):
    torch.manual_seed(0)
    plain = TinyGAN()
    swapped = copy.deepcopy(plain)
    budget = _gan_budget(copy.deepcopy(plain))
    trainer_for("auto", max_steps=20).fit(plain, loader("cnn", batches=3))

    recorder = StatsRecorder()
    plan_lines = []

    class PlanLines(Callback):
        """The plan lines logged up to the end of each training step."""

        def on_train_batch_end(self, *args):
            plan_lines.append([r.message for r in caplog.records if r.message.startswith("accudnn plan")])

    # Plans made at the end of their pass: when each pass's plan settles is what is checked.
    strategy = AccUDNNStrategy(budget=budget, min_swap_bytes=0, plan_in_background=False)
    with caplog.at_level(logging.INFO):
        trainer_for(strategy, max_steps=20, callbacks=[recorder, PlanLines()]).fit(
            swapped, loader("cnn", batches=3)
        )

    assert len(plan_lines) == 10  # 10 training steps of two passes (20 optimizer steps)
    # Per distinct pass: the plan of its profiling pass, then (second step) at most a plan for the
    # optimizer state its first update created, the plans refined from its own timings, one per
    # timed planned pass (TIMED_PLANNED_PASSES steps), and at most one made again from the passes
    # replayed under the last (STEADY_TIMED_PASSES steps). Never again.
    lines = plan_lines[-1]
    settled = plan_lines[TIMED_PLANNED_PASSES + STEADY_TIMED_PASSES]
    planned_after = TIMED_PLANNED_PASSES + STEADY_TIMED_PASSES + 1
    assert settled == lines, f"planned after step {planned_after}: {lines[len(settled) :]}"
    first, second = (
        [line for line in lines if "(pass 2" not in line],
        [line for line in lines if "(pass 2" in line],
    )
    most = 3 + TIMED_PLANNED_PASSES
    assert 1 <= len(first) <= most and 1 <= len(second) <= most, lines
    assert all(not stats.profiling for stats in recorder.stats[1:])
    assert all(stats.bytes_swapped_out > 0 for stats in recorder.stats)
    for (name, a), b in zip(plain.state_dict().items(), swapped.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs"


def test_keep_on_device_pattern_matching_no_module_is_refused_before_training_naming_close_names():
    model = Classifier("cnn")
    before = {name: value.clone() for name, value in model.named_parameters()}
    strategy = AccUDNNStrategy(budget="1GB", keep_on_device=["model.head", "model.blockz.*"])
    with pytest.raises(UnmatchedPatternError, match="'model.blockz.\\*' matches no module") as raised:
        trainer_for(strategy).fit(model, loader("cnn"))
    assert "'model.blocks" in str(raised.value)  # the closest names
    after = dict(model.named_parameters())
    assert all(torch.equal(value, after[name]) for name, value in before.items())
    assert strategy.stats is None  # not a single step ran


def test_keep_on_device_pattern_keeps_the_matched_module_on_the_device():
    strategy = AccUDNNStrategy(budget="1GB", min_swap_bytes=0, keep_on_device="model.head")
    trainer_for(strategy, max_steps=1).fit(Classifier("cnn"), loader("cnn"))
    assert strategy.stats.profiling and strategy.stats.bytes_swapped_out > 0
    head = [layer for layer in strategy.plan.profile.layers if layer.name.startswith("model.head")]
    assert head and all(layer.swappable_bytes == 0 for layer in head)


def test_cuda_device_without_a_gpu_says_no_cuda_device_is_available():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    with pytest.raises(RuntimeError, match="no CUDA device is available"):
        AccUDNNStrategy(device="cuda")
