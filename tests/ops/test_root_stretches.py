"""The step's own code that saves between submodules and again later is one layer per stretch,
in saves and in time: the loss's work is timed to the stretch that runs it."""

import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.timing import LayerTimer

NOW = [0.0]  # the clock: the model's own code moves it


class _Clock:
    def mark(self) -> float:
        return NOW[0]

    def seconds_between(self, start: float, end: float) -> float:
        return end - start

    def ready(self, mark: float) -> bool:
        return True


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        NOW[0] += 1.0  # its own code before its first layer
        x = torch.tanh(self.first(x))
        NOW[0] += 2.0  # between its layers, where it saves
        return self.last(x)


def test_each_stretch_of_the_step_s_own_code_is_a_layer_with_its_own_time():
    timer = LayerTimer(_Clock())
    tracker = LayerTracker(on_enter=timer.enter, on_exit=timer.exit)
    seen: list[str] = []
    hooks = torch.autograd.graph.saved_tensors_hooks(
        lambda t: seen.append(tracker.saving_layer()) or t, lambda t: t
    )
    model = _Model()
    with tracker.attached(model), hooks:
        timer.start()
        output = model(torch.ones(2, 4))
        NOW[0] += 5.0  # the loss, after the last layer
        loss = output.square().sum()
        timer.end_forward()
    assert list(dict.fromkeys(seen)) == ["first", "(root)", "last", "(root)#2"]
    seconds = timer.forward_self_seconds()
    assert (seconds["(root)"], seconds["(root)#2"]) == (3.0, 5.0)
    loss.backward()
