"""What the ``accudnn plan`` tests share: running the command, an independent count, the JSON checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lightning_accudnn", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def conv_and_bn_output_bytes(name: str, batch: int) -> int:
    """Independent estimate of ResNet's saved activations: every conv and BN output, once.

    BN saves its input (the conv output) and the in-place ReLU after it saves BN's output;
    everything else (the image, pooling indices, statistics) is small next to these.
    """
    import torchvision

    model = torchvision.models.get_model(name).to("meta")
    total = 0

    def hook(module: nn.Module, inputs: object, output: torch.Tensor) -> None:
        nonlocal total
        total += output.numel() * output.element_size()

    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.BatchNorm2d)):
            module.register_forward_hook(hook)
    model(torch.zeros(batch, 3, 224, 224, device="meta"))
    return total


def check_plan_json(report: dict, budget: int) -> None:
    assert report["feasible"] is True
    assert report["budget_bytes"] == budget
    assert report["predicted_peak_bytes"] <= budget - report["reserve_bytes"]
    assert report["saved_peak_bytes"] <= report["predicted_peak_bytes"]  # the ledger's, and the plan's
    assert report["working_bytes"] > 0  # the loss and the gradients, at least
    # What each level holds beyond it, not the most held anywhere added to the reserve.
    assert any(layer["backward_working_bytes"] for layer in report["layers"])
    assert report["min_budget_bytes"] <= budget
    assert report["lower_bound_seconds"] > 0
    assert report["predicted_step_seconds"] >= report["lower_bound_seconds"] * (1 - 1e-9)
    assert report["predicted_step_seconds"] >= report["unconstrained_step_seconds"] * (1 - 1e-9)
    assert report["layers"]
