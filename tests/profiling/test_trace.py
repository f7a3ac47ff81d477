"""The fake-tensor trace against real CPU runs, dtypes, filters and FLOP attribution."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.planner import plan_swaps
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import StepTrace, trace_step
from tests.models import MLP, SmallResNet, TinyGPT, transformer_encoder
from tests.profiling.real_step import real_saved_by_layer


class _TruncNormalInit(nn.Module):
    """Initialised by rejection sampling (values decide): built on meta, then made fake."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        nn.init.trunc_normal_(self.fc.weight, std=0.02)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def traced_saved_by_layer(trace: StepTrace) -> dict[str, int]:
    return {layer.name: layer.saved_bytes for layer in trace.layers if layer.saved_bytes}


@pytest.mark.parametrize(
    ("factory", "batch"),
    [
        (SmallResNet, torch.zeros(8, 3, 16, 16)),
        (TinyGPT, torch.zeros(8, 16, dtype=torch.long)),
        (MLP, torch.zeros(32, 64)),
        (transformer_encoder, torch.zeros(4, 32, 64)),
        (_TruncNormalInit, torch.zeros(16, 64)),
    ],
    ids=["resnet", "gpt", "mlp", "transformer", "trunc-normal-init"],
)
def test_fake_trace_matches_real_saved_bytes_per_layer(factory, batch) -> None:
    real = real_saved_by_layer(factory(), batch)
    trace = trace_step(factory, tuple(batch.shape), tracker=LayerTracker(), input_dtype=batch.dtype)
    assert traced_saved_by_layer(trace) == real
    assert sum(real.values()) > 0


def test_weights_and_their_views_are_not_saved_activations() -> None:
    # nn.Linear saves weight.t(): a view of the parameter, not an activation.
    trace = trace_step(lambda: nn.Linear(256, 256, bias=False), (4, 256), tracker=LayerTracker())
    assert trace.saved_bytes == 4 * 256 * 4  # only the input


def test_one_storage_saved_by_two_layers_counts_once() -> None:
    # BN saves the conv output; an in-place ReLU saves BN's output, which the next conv saves again.
    def build() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 1)
        )

    trace = trace_step(build, (2, 3, 8, 8), tracker=LayerTracker())
    saved = traced_saved_by_layer(trace)
    activation = 2 * 8 * 8 * 8 * 4
    assert saved["1"] >= activation  # conv output (+ two 32-byte statistics)
    assert saved["2"] == activation  # BN output, after the in-place ReLU
    assert "3" not in saved  # the second conv's input is ReLU's storage: already counted


def test_bf16_mixed_precision_roughly_halves_activation_bytes() -> None:
    fp32 = trace_step(SmallResNet, (16, 3, 32, 32), tracker=LayerTracker())
    bf16 = trace_step(SmallResNet, (16, 3, 32, 32), tracker=LayerTracker(), dtype="bf16")
    assert 0.45 <= bf16.saved_bytes / fp32.saved_bytes <= 0.6
    assert bf16.param_bytes == fp32.param_bytes  # autocast keeps fp32 parameters
    gpu = get_gpu("h100")
    fp32_seconds = sum(f + b for f, b in fp32.layer_seconds(gpu).values())
    bf16_seconds = sum(f + b for f, b in bf16.layer_seconds(gpu).values())
    assert bf16_seconds < fp32_seconds


def test_bf16_true_casts_the_model_and_its_float_inputs() -> None:
    """Lightning's "bf16-true": parameters in bf16 (half the bytes, ties kept), every floating
    activation in bf16, no op promoted to fp32 as autocast promotes layer norms."""
    fp32 = trace_step(SmallResNet, (16, 3, 32, 32), tracker=LayerTracker())
    true = trace_step(SmallResNet, (16, 3, 32, 32), tracker=LayerTracker(), dtype="bf16-true")
    assert true.param_bytes * 2 == fp32.param_bytes
    assert 0.45 <= true.saved_bytes / fp32.saved_bytes <= 0.55

    def gpt() -> nn.Module:
        model = TinyGPT()
        model.lm_head.weight = model.embed.weight  # tied: one parameter after the cast too
        return model

    gpt_fp32 = trace_step(gpt, (4, 16), tracker=LayerTracker(), input_dtype=torch.long)
    gpt_true = trace_step(gpt, (4, 16), tracker=LayerTracker(), input_dtype=torch.long, dtype="bf16-true")
    gpt_mixed = trace_step(gpt, (4, 16), tracker=LayerTracker(), input_dtype=torch.long, dtype="bf16")
    assert gpt_true.param_bytes * 2 == gpt_fp32.param_bytes
    assert gpt_true.saved_bytes < gpt_mixed.saved_bytes < gpt_fp32.saved_bytes


def test_flops_match_flop_counter_and_backward_goes_to_the_forward_layer() -> None:
    model = MLP(width=128)
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros(64, 128)).float().mean().backward()
    trace = trace_step(lambda: MLP(width=128), (64, 128), tracker=LayerTracker())
    assert trace.forward_flops + trace.backward_flops == counter.get_total_flops()
    layers = {layer.name: layer for layer in trace.layers}
    first, hidden = layers["body.0"], layers["body.2"]
    assert first.forward_flops == 2 * 64 * 128 * 128
    assert first.backward_flops == first.forward_flops  # no grad for the input: weight grad only
    assert hidden.backward_flops == 2 * hidden.forward_flops  # input and weight grads


def test_depthwise_convolution_backward_is_twice_the_forward() -> None:
    """Hand count: a depthwise 3x3 convolution over 8 channels of 16x16, batch 2, padding 1.
    Forward: 2 (multiply-add) x 2 (batch) x 8 (channels) x 16 x 16 (outputs) x 9 (taps) x 1
    (input channel per group) = 73728. Its input needs a gradient (a 1x1 convolution comes
    first), so backward is the input gradient plus the weight gradient, 73728 each."""
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=1, groups=8))
    trace = trace_step(lambda: model, (2, 8, 16, 16), tracker=LayerTracker())
    depthwise = next(layer for layer in trace.layers if layer.name == "1")
    assert depthwise.forward_flops == 2 * 2 * 8 * 16 * 16 * 9 == 73728
    assert depthwise.backward_flops == 2 * 73728
    pointwise = next(layer for layer in trace.layers if layer.name == "0")
    assert pointwise.backward_flops == pointwise.forward_flops  # the batch needs no gradient


def test_dropout_mask_is_saved_as_bool_as_on_cuda() -> None:
    trace = trace_step(
        lambda: nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.1)), (32, 64), tracker=LayerTracker()
    )
    saved = traced_saved_by_layer(trace)
    assert saved["1"] == 32 * 64  # one byte per element


def test_swappable_threshold_and_static_bytes() -> None:
    trace = trace_step(
        lambda: nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()), (512, 1024), tracker=LayerTracker()
    )
    profile = trace.to_profile(get_gpu("a100"), optimizer="sgd-momentum", min_swap_bytes=2**20)
    assert [layer.saved_bytes for layer in profile.layers[:2]] == [2**21, 2**21]
    # The Linear saves the batch, which the step holds throughout: the engine keeps it.
    assert [layer.swappable_bytes for layer in profile.layers[:2]] == [0, 2**21]
    params = (1024 * 1024 + 1024) * 4
    assert profile.static_bytes == 3 * params  # weights, gradients, momentum
    assert trace.to_profile(get_gpu("a100"), min_swap_bytes=2**22).swappable_bytes == 0
    assert trace.static_bytes("none") == trace.static_bytes("sgd") == 2 * params  # plain SGD: no state
    assert trace.static_bytes("adam") == 4 * params
    with pytest.raises(ValueError, match="choose one of"):
        trace.static_bytes("lion")
    # Between the passes: Adam's multi-tensor step holds the square roots of its second moments.
    assert profile.outside_working_bytes == 0
    adam = trace.to_profile(get_gpu("a100"), optimizer="adamw")
    assert adam.outside_working_bytes == params
    assert plan_swaps(adam, adam.static_bytes + params, policy="swap").predicted_peak_bytes >= 5 * params


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        trace_step(MLP, (2, 64), tracker=LayerTracker(), dtype="fp8")


class _Attention(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, q, q)


def test_attention_flops_are_counted_on_the_cpu_flash_kernel() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)
            self.attention = _Attention()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attention(self.proj(x).view(2, 4, 64, 8))

    trace = trace_step(Model, (2, 64, 32), tracker=LayerTracker())
    attention = next(layer for layer in trace.layers if layer.name == "attention")
    assert attention.forward_flops == 2 * (2 * 4 * 64 * 64 * 8) * 2  # QK^T and PV
    assert attention.backward_flops > attention.forward_flops
    assert attention.saved_bytes < 2 * 4 * 64 * 64 * 4  # no attention matrix: output and log-sum-exp
