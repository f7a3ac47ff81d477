"""Lightning features users rely on keep working with swapping on, results bit for bit equal."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_accudnn import AccUDNNStrategy
from lightning_accudnn.ops import OffloadEngine, SwapSchedule
from tests.models import Classifier, ResidualBlock, loader, make_batch
from tests.strategy.helpers import StatsRecorder, memory_need, trainer_for


def _fit_both(model, data_kind="cnn", max_steps=4, **trainer_options):
    """Fit a copy plainly and a copy with swapping forced; return both and the swapping stats."""
    plain, swapped = model, copy.deepcopy(model)
    trainer_for("auto", max_steps=max_steps, **trainer_options).fit(plain, loader(data_kind))
    static, saved = memory_need("cnn")
    recorder = StatsRecorder()
    strategy = AccUDNNStrategy(budget=static + saved // 2, min_swap_bytes=0)
    trainer_for(strategy, max_steps=max_steps, callbacks=[recorder], **trainer_options).fit(
        swapped, loader(data_kind)
    )
    return plain, swapped, recorder


def _assert_equal(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), f"{name} differs"


def test_bf16_mixed_precision_swaps_half_size_activations_and_matches():
    torch.manual_seed(0)
    plain, swapped, recorder = _fit_both(Classifier("cnn"), precision="bf16-mixed")
    _assert_equal(plain, swapped)
    torch.manual_seed(0)
    _, _, fp32 = _fit_both(Classifier("cnn"), max_steps=1)
    # The profiling step swaps everything: bf16 activations move at their own size.
    assert recorder.stats[0].bytes_swapped_out < 0.75 * fp32.stats[0].bytes_swapped_out


def test_fp16_autocast_activations_swap_at_their_size_and_gradients_match():
    model = Classifier("cnn").model
    reference = copy.deepcopy(model)
    batch = make_batch("cnn")
    engine = OffloadEngine(torch.device("cpu"), min_swap_bytes=0)
    with torch.autocast("cpu", dtype=torch.float16), engine.offload(model, SwapSchedule.swap_everything()):
        loss = F.cross_entropy(model(batch[0]).float(), batch[1])
    loss.backward()
    stats = engine.end_step()
    with torch.autocast("cpu", dtype=torch.float16):
        F.cross_entropy(reference(batch[0]).float(), batch[1]).backward()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    with engine.offload(reference, SwapSchedule.swap_everything()):
        loss = F.cross_entropy(reference(batch[0]), batch[1])
    loss.backward()
    full = engine.end_step()
    assert 0 < stats.bytes_swapped_out < 0.75 * full.bytes_swapped_out


def test_gradient_accumulation_and_clipping():
    torch.manual_seed(0)
    plain, swapped, recorder = _fit_both(
        Classifier("cnn"), accumulate_grad_batches=2, gradient_clip_val=0.5, gradient_clip_algorithm="norm"
    )
    _assert_equal(plain, swapped)
    assert all(stats.bytes_swapped_out > 0 for stats in recorder.stats)


class TwoOptimizers(Classifier):
    """Manual optimization with a forward and backward per optimizer in one training_step."""

    def __init__(self):
        super().__init__("cnn")
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        body, head = self.optimizers()
        for optimizer in (body, head):
            loss = super().training_step(batch, batch_idx)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

    def configure_optimizers(self):
        head = list(self.model.head.parameters())
        body = [p for n, p in self.model.named_parameters() if not n.startswith("head.")]
        return torch.optim.SGD(body, lr=0.05, momentum=0.9), torch.optim.Adam(head, lr=1e-3)


def test_manual_optimization_with_two_optimizers():
    torch.manual_seed(0)
    plain, swapped, recorder = _fit_both(TwoOptimizers())
    _assert_equal(plain, swapped)
    assert recorder.stats and all(stats.bytes_swapped_out > 0 for stats in recorder.stats)


class ChannelsLast(Classifier):
    def __init__(self):
        super().__init__("cnn")
        self.model = self.model.to(memory_format=torch.channels_last)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return super().training_step(
            (images.contiguous(memory_format=torch.channels_last), labels), batch_idx
        )


def test_channels_last_model():
    torch.manual_seed(0)
    plain, swapped, _ = _fit_both(ChannelsLast())
    _assert_equal(plain, swapped)


class Checkpointed(Classifier):
    """Residual blocks under torch.utils.checkpoint: their own saved-tensor hooks nest inside ours."""

    def __init__(self, reentrant: bool):
        super().__init__("cnn")
        self.reentrant = reentrant

    def training_step(self, batch, batch_idx):
        images, labels = batch
        model = self.model
        x = model.stem(images)
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return F.cross_entropy(model.head(x.mean(dim=(2, 3))), labels)


@pytest.mark.parametrize("reentrant", [False, True])
def test_models_using_activation_checkpointing(reentrant):
    torch.manual_seed(0)
    plain, swapped, recorder = _fit_both(Checkpointed(reentrant))
    _assert_equal(plain, swapped)
    torch.manual_seed(0)
    _, _, uncheckpointed = _fit_both(Classifier("cnn"), max_steps=1)
    # Checkpointed regions save nothing for us to swap: far fewer bytes move.
    assert 0 < recorder.stats[0].bytes_swapped_out < 0.5 * uncheckpointed.stats[0].bytes_swapped_out


class DynamicDepth(Classifier):
    """Unused parameters and control flow: odd batches skip the extra block."""

    def __init__(self):
        super().__init__("cnn")
        self.extra = ResidualBlock(16)
        self.never_used = nn.Linear(3, 3)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        x = self.model.blocks(self.model.stem(images))
        if batch_idx % 2 == 0:
            x = self.extra(x)
        return F.cross_entropy(self.model.head(x.mean(dim=(2, 3))), labels)


def test_dynamic_control_flow_replans_from_the_changed_graph():
    torch.manual_seed(0)
    plain, swapped, recorder = _fit_both(DynamicDepth())
    _assert_equal(plain, swapped)
    names = [{layer.name for layer in plan.profile.layers} for plan in recorder.plans]
    assert any("extra.conv1" in n or "extra.bn1" in n for n in names)
    assert any(not any(name.startswith("extra.") for name in n) for n in names), "the graph change re-planned"
