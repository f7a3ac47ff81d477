"""``accudnn plan`` on ResNet-152 at batch 64 for an H100, as the README shows it (a trace of
several seconds each: apart from tests/cli/test_cli.py so that pytest-xdist can spread them).

The commands run in this process through :func:`lightning_accudnn.cli.main`, the entry point of
``accudnn`` and ``python -m lightning_accudnn`` (a fresh interpreter would add seconds of imports
to each; test_cli.py's ``python -m`` test runs the command as a subprocess)."""

from __future__ import annotations

import json

import pytest

from lightning_accudnn.cli import build_parser, main, resolve_model
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.planner.plan import plan_swaps
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.profiling.trace import trace_step
from tests.cli.helpers import HAS_MATPLOTLIB, check_plan_json, conv_and_bn_output_bytes


def test_resnet152_batch64_on_h100_at_8gb(capsys) -> None:
    """The command from the README, traced and planned (how long it takes is for benchmarks)."""
    args = [
        "plan",
        "torchvision:resnet152",
        "--batch-size",
        "64",
        "--budget",
        "8GB",
        "--gpu",
        "h100",
        "--json",
    ]
    returncode = main(args)
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["model"], report["gpu"], report["batch_size"]) == (
        "torchvision:resnet152",
        "H100 SXM 80GB",
        64,
    )
    assert report["budget_bytes"] == 8 * 10**9

    # Saved activations: within 5% of an independent count (conv and BN outputs), ~11.5 GB.
    estimate = conv_and_bn_output_bytes("resnet152", 64)
    assert 10e9 < estimate < 13e9
    assert abs(report["saved_bytes"] - estimate) / estimate < 0.05
    assert report["saved_bytes"] == sum(layer["saved_bytes"] for layer in report["layers"])
    names = [layer["name"] for layer in report["layers"]]
    assert names[0] == "conv1" and "layer4.2.relu#3" in names
    # Adam: weights, gradients and two moments of 60.2M fp32 parameters, plus BN buffers.
    assert 4 * 60.1e6 * 4 < report["static_bytes"] < 4 * 60.3e6 * 4 + 2e6

    # The forward waits for the host link past the copy-out limit, so 8GB fits, at a cost.
    assert returncode == 0, captured.err
    check_plan_json(report, 8 * 10**9)
    assert report["predicted_step_seconds"] >= report["lower_bound_seconds"] > 0


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib (the 'plot' extra)")
def test_readme_plot_example_on_resnet152(tmp_path, capsys) -> None:
    """The README's command, verbatim but for the file: swapped layers used in place in
    backward have no copy in, and the plot must still be drawn (it crashed on them)."""
    path = tmp_path / "x.png"
    args = ["plan", "torchvision:resnet152", "--batch-size", "64", "--budget", "8GB", "--gpu", "h100"]
    returncode = main([*args, "--plot", str(path)])
    captured = capsys.readouterr()
    assert returncode == 0, captured.err
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert "predicted peak" in captured.out


def test_resnet152_at_a_third_of_its_need_auto_plans_a_faster_step_than_swap() -> None:
    """ResNet-152 at batch 64 for an H100, as `accudnn plan torchvision:resnet152 --batch-size 64 --gpu h100
    --json` plans it (traced once here, planned under both policies): at a third of the
    unconstrained need the link cannot hide the swaps, and recomputing some blocks is faster."""
    command = ["plan", "torchvision:resnet152", "--batch-size", "64", "--gpu", "h100", "--budget", "1GB"]
    args = build_parser().parse_args(command)  # the command's defaults (optimizer, min_swap_bytes)
    gpu = get_gpu(args.gpu)
    trace = trace_step(resolve_model(args.model).build, (64, 3, 224, 224), tracker=LayerTracker())
    profile = trace.to_profile(gpu, optimizer=args.optimizer, min_swap_bytes=args.min_swap_bytes)
    budget = profile.unconstrained_peak_bytes // 3
    auto, swap = (plan_swaps(profile, budget, policy=policy).to_dict() for policy in ("auto", "swap"))
    assert auto["recomputed_segments"] and not swap["recomputed_segments"]
    assert auto["predicted_step_seconds"] < swap["predicted_step_seconds"]
    assert max(auto["predicted_peak_bytes"], swap["predicted_peak_bytes"]) <= budget
