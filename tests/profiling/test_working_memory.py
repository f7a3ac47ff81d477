"""What a traced step holds at once besides the model's state and its saved activations."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.profile import ROOT_LAYER
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step
from lightning_accudnn.profiling.working_memory import StorageLog

MIB4 = 4 * 2**20  # one 1024 x 1024 float32 tensor
SCALARS = 64  # the loss, its gradient: a few bytes


class _Scale(nn.Module):
    """``x * factor``: a product by a number saves nothing for backward."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class _Shift(nn.Module):
    """``x + bias``: a sum saves nothing for backward."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


class _TimesConstant(nn.Module):
    """``x * constant``, a tensor the module keeps outside its parameters and buffers (the step
    did not create it): the product saves it for backward."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.constant = torch.ones(features, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.constant


def _working(*modules: nn.Module, shape: tuple[int, ...] = (1024, 1024)) -> tuple[int, int]:
    trace = trace_step(lambda: nn.Sequential(*modules), shape, tracker=LayerTracker())
    return trace.working_bytes, trace.saved_bytes


def test_outputs_nothing_saves_and_the_activation_gradients_count_at_their_most():
    """Nothing saves the products: forward holds two at a time; backward the gradients of two
    at once, the output (the loss is its mean) let go once its loss was computed."""
    working, saved = _working(nn.Linear(1024, 1024), _Scale(2.0), _Scale(3.0))
    assert saved == MIB4  # the batch, saved by the linear layer
    assert 2 * MIB4 <= working <= 2 * MIB4 + SCALARS


def test_saved_activations_are_left_out():
    """ReLU saves its output (the step's): the saves are the ledger's, not working memory."""
    working, saved = _working(nn.Linear(1024, 1024), _Scale(2.0), _Scale(3.0), nn.ReLU())
    assert saved == 2 * MIB4
    assert 2 * MIB4 <= working <= 2 * MIB4 + SCALARS


def test_the_parameters_gradients_are_left_out():
    """The weight's gradient (64 MiB) is model state; the 16 KiB output, then its gradient, are not."""
    working, _ = _working(nn.Linear(4096, 4096, bias=False), shape=(1, 4096))
    assert 16 * 2**10 <= working <= 16 * 2**10 + SCALARS


def test_an_address_used_again_is_another_storage():
    log = StorageLog()
    kept = torch.ones(1024)
    keys = []
    for _ in range(50):  # each freed at once: the allocator hands the same address back
        temporary = torch.ones(1024)
        log.created([temporary])
        keys.append(log.key(temporary))
        del temporary
    log.created([kept])
    assert len(set(keys)) == 50
    assert log.peak_bytes() == 4096 and log.peak_bytes({log.key(kept)}) == 4096
    assert log.peak_bytes(set(keys)) == 4096  # the temporaries left out, the kept one remains


def test_a_cross_entropy_needs_logits_with_a_class_dimension():
    with pytest.raises(ValueError, match="class dimension last"):
        trace_step(
            lambda: nn.Sequential(nn.Linear(8, 1), nn.Flatten(0)),
            (4, 8),
            tracker=LayerTracker(),
            loss="cross-entropy",
        )
    with pytest.raises(ValueError, match="unknown loss 'l1': one of mean, cross-entropy"):
        trace_step(lambda: nn.Linear(8, 2), (4, 8), tracker=LayerTracker(), loss="l1")


# -- working memory at each level -------------------------------------------------------------

LOGITS = 256 * 8192 * 4  # a batch of 256 over 8192 classes, float32: 8 MiB
SMALL = 4096  # the targets (2 KiB), the loss, its gradient
FIRST_GRADS = (64 * 256 + 256) * 4  # the gradients of the classifier's first Linear
GRADS = FIRST_GRADS + (256 * 8192 + 8192) * 4  # and of its last: 8.1 MiB


class _ForwardScratch(nn.Module):
    """Holds a scratch 16 times its input in forward that nothing saves and backward never makes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scale = x.repeat(16, 1).amax()
        return x * scale


class _RootFirst(nn.Module):
    """Runs a kernel of its own before its children: the trace puts ``(root)`` first, though the
    loss's saves come last in forward and are read first in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _classifier()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x * 2.0)


def _classifier() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8192))


def _levels(build, shape=(256, 64), loss="cross-entropy"):
    return trace_step(build, shape, tracker=LayerTracker(), loss=loss, meter=WorkingMemoryMeter)


def _planned_peak(trace) -> int:
    """The planner's peak with everything kept, model state left out: each layer's level (the
    saves of the layers up to it) plus what the step held beyond it in its forward and backward."""
    peak = saved = 0
    for layer in trace.layers:
        saved += layer.saved_bytes
        peak = max(peak, saved + layer.forward_working_bytes, saved + layer.backward_working_bytes)
    return peak


def test_the_logits_are_at_the_last_saving_layers_forward_and_their_gradients_at_the_loss_backward():
    trace = _levels(_classifier)
    layers = {layer.name: layer for layer in trace.layers}
    assert [name for name, layer in layers.items() if layer.saved] == ["0", "1", ROOT_LAYER]
    # The last Linear saves the ReLU's output again, nothing of its own: the ReLU is the last to
    # have saved when the logits and their log-softmax (before the loss saves it) are held; the
    # parameters' gradients, which the level counts as model state, are not made yet.
    assert abs(layers["1"].forward_working_bytes - (2 * LOGITS - GRADS)) <= SMALL
    assert layers["2"].forward_working_bytes == 0
    # The loss's backward: the log-softmax's gradient and the logits' gradient beyond every save
    # (its level, the last), the logits let go with the loss computed, no gradient made yet.
    assert abs(layers[ROOT_LAYER].backward_working_bytes - (2 * LOGITS - GRADS)) <= SMALL
    # The last Linear's backward, at its own level (it saves only the ReLU's output, again): the
    # logits' gradient, its input's, and its own parameters' (the first Linear's not made yet);
    # the ReLU's: the gradients of its output and its input; the first Linear's: the ReLU's
    # gradient, every parameter's gradient made.
    hidden = 256 * 256 * 4
    assert abs(layers["2"].backward_working_bytes - (LOGITS + hidden - FIRST_GRADS)) <= SMALL
    assert abs(layers["1"].backward_working_bytes - (2 * hidden - FIRST_GRADS)) <= SMALL
    assert abs(layers["0"].backward_working_bytes - hidden) <= SMALL
    profile = trace.to_profile(get_gpu("h100"), optimizer="sgd")
    assert [(layer.forward_working_bytes, layer.backward_working_bytes) for layer in profile.layers] == [
        (layer.forward_working_bytes, layer.backward_working_bytes) for layer in trace.layers
    ]


@pytest.mark.parametrize(
    ("build", "loss", "peak_in"),
    [
        (_classifier, "cross-entropy", "backward"),
        (_RootFirst, "cross-entropy", "backward"),
        (lambda: nn.Sequential(nn.Linear(64, 256), _ForwardScratch(), nn.Linear(256, 64)), "mean", "forward"),
    ],
    ids=["cross-entropy", "root-first", "forward-scratch"],
)
def test_each_level_and_what_it_holds_beyond_it_never_fall_short_of_the_step(build, loss, peak_in):
    """The planner's peak, levels plus working memory, against the most the traced step held at
    once besides model state: never below, at most 2% above; where the step peaks, only the
    working memory of that pass reaches it."""
    trace = _levels(build, loss=loss)
    planned = _planned_peak(trace)
    assert trace.allocated_peak_bytes <= planned <= 1.02 * trace.allocated_peak_bytes
    other = "backward" if peak_in == "forward" else "forward"
    without = [dataclasses.replace(layer, **{f"{other}_working_bytes": 0}) for layer in trace.layers]
    assert _planned_peak(dataclasses.replace(trace, layers=tuple(without))) == planned
    without = [dataclasses.replace(layer, **{f"{peak_in}_working_bytes": 0}) for layer in trace.layers]
    assert _planned_peak(dataclasses.replace(trace, layers=tuple(without))) < trace.allocated_peak_bytes


def test_without_a_meter_no_layer_lists_working_memory():
    trace = trace_step(_classifier, (256, 64), tracker=LayerTracker(), loss="cross-entropy")
    assert trace.working_bytes > 0
    assert all(not layer.forward_working_bytes and not layer.backward_working_bytes for layer in trace.layers)


def test_the_batch_is_held_from_the_start_of_the_step():
    """Nothing saves the batch here (adding a bias saves nothing): on a device it is held all the
    same, beside the sum, when the ReLU saves its output (the bias's gradient not made yet)."""
    trace = _levels(lambda: nn.Sequential(_Shift(1024), nn.ReLU()), shape=(1024, 1024), loss="mean")
    relu = trace.layers[1]
    assert relu.name == "1" and relu.saved_bytes == MIB4
    bias_grad = 1024 * 4
    assert 2 * MIB4 - bias_grad <= relu.forward_working_bytes <= 2 * MIB4 - bias_grad + SCALARS
    assert trace.allocated_peak_bytes <= _planned_peak(trace) <= trace.allocated_peak_bytes + SCALARS


def test_a_save_the_step_did_not_create_is_held_from_its_save():
    """The constant is on the ledger from its save, and on the device as the ledger says: the
    backward holds it, the batch and two gradients, the bias's not made yet (the product, the
    step's output, let go once its loss was computed)."""
    trace = _levels(
        lambda: nn.Sequential(_Shift(1024), _TimesConstant(1024)), shape=(1024, 1024), loss="mean"
    )
    assert trace.layers[1].saved_bytes == MIB4  # the constant; the sum is its input, saved first by "1"
    most = 4 * MIB4 - 1024 * 4
    assert most <= trace.allocated_peak_bytes <= _planned_peak(trace) <= most + SCALARS


# -- what a training step lets go and makes ---------------------------------------------------


def test_the_output_is_let_go_once_its_loss_is_computed():
    """A 8 MiB output next to a 64 KiB save (the batch, for the weight's gradient): backward
    holds the output's gradient, not the output too, as a step returning its loss does."""
    trace = trace_step(
        lambda: nn.Sequential(nn.Linear(64, 8192)),
        (256, 64),
        tracker=LayerTracker(),
        loss="mean",
        meter=WorkingMemoryMeter,
        set_grads_to_none=False,  # the gradients held all step: the output alone is looked at
    )
    (linear, _root) = trace.layers
    assert linear.saved_bytes == 256 * 64 * 4
    assert abs(linear.forward_working_bytes - LOGITS) <= SMALL  # the output, before the loss
    assert abs(linear.backward_working_bytes - LOGITS) <= SMALL  # its gradient alone
    assert trace.allocated_peak_bytes <= _planned_peak(trace) <= trace.allocated_peak_bytes + SMALL


WEIGHT_GRAD = 2048 * 2048 * 4  # 16 MiB...
ACTIVATIONS = 2 * 8 * 2048 * 4  # ... against two activations (or their gradients) of 64 KiB


def _two_linears(set_grads_to_none: bool):
    return trace_step(
        lambda: nn.Sequential(nn.Linear(2048, 2048, bias=False), nn.Linear(2048, 2048, bias=False)),
        (8, 2048),
        tracker=LayerTracker(),
        loss="mean",
        meter=WorkingMemoryMeter,
        set_grads_to_none=set_grads_to_none,
    )


def test_a_gradient_set_to_none_is_counted_from_its_making_in_backward():
    """The model state counts both weights' gradients all step; a step that sets them to None
    makes the last layer's in its backward, the first layer's in the first layer's: until then a
    level holds that much less than it counts."""
    trace = _two_linears(set_grads_to_none=True)
    first, last = trace.layers[:2]
    assert (first.name, last.name) == ("0", "1")
    for layer in (first, last):
        assert -2 * WEIGHT_GRAD < layer.forward_working_bytes <= -2 * WEIGHT_GRAD + ACTIVATIONS + SMALL
    assert -WEIGHT_GRAD < last.backward_working_bytes <= -WEIGHT_GRAD + ACTIVATIONS + SMALL
    assert 0 < first.backward_working_bytes <= ACTIVATIONS + SMALL  # every gradient made
    assert trace.allocated_peak_bytes <= _planned_peak(trace) <= trace.allocated_peak_bytes + SMALL


def test_gradients_held_all_step_are_model_state_the_whole_step():
    trace = _two_linears(set_grads_to_none=False)
    for layer in trace.layers[:2]:
        assert 0 < layer.forward_working_bytes <= ACTIVATIONS + SMALL
        assert 0 < layer.backward_working_bytes <= ACTIVATIONS + SMALL
    assert trace.allocated_peak_bytes <= _planned_peak(trace) <= trace.allocated_peak_bytes + SMALL
