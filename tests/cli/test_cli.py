"""``accudnn plan``: JSON contract, errors and plots (ResNet-152 at batch 64: test_cli_resnet152.py)."""

from __future__ import annotations

import json
import math

import pytest

from lightning_accudnn.cli import main
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn.session.config import default_reserve_bytes
from tests.cli.helpers import HAS_MATPLOTLIB, check_plan_json, run_cli

SMALL = ["tests.models:SmallResNet", "--input-shape", "3,32,32", "--batch-size", "8", "--gpu", "l4"]
#: TinyGPT's 4 x 16 tokens in bf16 for an H100.
TINY_GPT = ["plan", "tests.models:TinyGPT", "--input-shape", "16", "--input-dtype", "long"]
TINY_GPT += ["--batch-size", "4", "--gpu", "h100", "--dtype", "bf16"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["torchvision:resnet1234", "--budget", "8GB", "--gpu", "h100"], ["resnet152", "vit_b_16"]),
        (
            ["torchvision:resnet18", "--budget", "8GB", "--gpu", "tpu-v5"],
            ["h100", "a100-80gb", "l4", "v100-32gb"],
        ),
        (["torchvision:resnet18", "--budget", "eight gigs", "--gpu", "h100"], ["12GiB", "80%", "auto"]),
        (["torchvision:resnet18", "--budget", "100GB", "--gpu", "l4"], ["at most"]),
        (["no_such_module_xyz:build", "--budget", "8GB", "--gpu", "h100"], ["cannot import"]),
        (["tests.models:NoSuchFactory", "--budget", "8GB", "--gpu", "h100"], ["TinyGPT"]),
        (["tests.models:TinyGPT", "--budget", "8GB", "--gpu", "h100"], ["--input-shape"]),
    ],
    ids=["model", "gpu", "budget", "budget-too-big", "module", "factory", "no-input-shape"],
)
def test_usage_errors_exit_2_and_list_the_choices(args, expected, capsys) -> None:
    assert main(["plan", *args, "--batch-size", "8"]) == 2
    err = capsys.readouterr().err
    for choice in expected:
        assert choice in err


def test_python_dash_m_runs_the_same_command() -> None:
    result = run_cli("plan", "torchvision:resnet18", "--batch-size", "8", "--budget", "8GB", "--gpu", "nope")
    assert result.returncode == 2
    assert "unknown GPU 'nope'" in result.stderr and "h100-pcie" in result.stderr


def test_infeasible_budget_exits_1_with_the_smallest_budget_that_fits(capsys) -> None:
    assert main(["plan", *SMALL, "--budget", "1000", "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    need = report["min_budget_bytes"]
    assert report["feasible"] is False and need > 1000
    assert "smallest budget that fits" in captured.err and str(need) in captured.err
    assert main(["plan", *SMALL, "--budget", str(need), "--json"]) == 0
    check_plan_json(json.loads(capsys.readouterr().out), need)


def test_no_policy_names_a_budget_below_the_profiling_pass(capsys) -> None:
    """At the 1 MiB default the small ResNet swaps nothing: recomputing would peak lower, but
    the profiling pass (every activation swapped, none recomputed) keeps everything, so every
    policy names the same smallest budget, says when that pass is what binds, and plans at it."""
    named = set()
    small = [*SMALL, "--reserve", "0"]  # the budget is the plans' own: no reserve under it
    for policy in ("swap", "auto", "recompute"):
        assert main(["plan", *small, "--budget", "1000", "--policy", policy, "--json"]) == 1
        captured = capsys.readouterr()
        report = json.loads(captured.out)
        assert report["profiling_binds"] is (policy != "swap")
        assert ("first pass of a new batch shape" in captured.err) is (policy != "swap")
        named.add(report["min_budget_bytes"])
        need = report["min_budget_bytes"]
        assert main(["plan", *small, "--budget", str(need), "--policy", policy, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        check_plan_json(plan, need)
        assert plan["profiling_peak_bytes"] == plan["min_budget_bytes"] == need
    assert named == {report["unconstrained_peak_bytes"]}
    assert main(["plan", *small, "--budget", str(need)]) == 0
    assert "the profiling pass, every activation swapped and none recomputed" in capsys.readouterr().out


def test_the_smallest_budget_named_holds_the_default_reserve_of_a_session_on_a_gpu(capsys) -> None:
    """By default the plans keep a training session's reserve on a GPU (the larger of 256 MiB and
    5 % of the budget, growing with it): the smallest budget named plans, and a byte less is
    refused, each with the reserve of its own budget."""
    gpt = [*TINY_GPT, "--json"]
    assert main([*gpt, "--budget", "40GB"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["reserve_bytes"] == 2 * 10**9  # 5 % of 40 GB
    need = report["min_budget_bytes"]
    assert need - default_reserve_bytes(need, "cuda") == report["profiling_peak_bytes"]
    assert main([*gpt, "--budget", str(need)]) == 0
    capsys.readouterr()
    assert main([*gpt, "--budget", str(need - 1)]) == 1
    refused = json.loads(capsys.readouterr().out)
    assert refused["min_budget_bytes"] == need


def test_small_model_is_told_that_min_swap_bytes_limits_the_smallest_budget(capsys) -> None:
    """At the 1 MiB default the small ResNet swaps nothing; the error names a threshold that
    lowers the smallest budget, and that budget plans with that threshold."""
    assert main(["plan", *SMALL, "--budget", "1000"]) == 1
    err = capsys.readouterr().err
    assert "limited by min_swap_bytes" in err
    threshold = int(err.split("with min_swap_bytes=")[1].split()[0])
    assert main(["plan", *SMALL, "--budget", "1000", "--min-swap-bytes", str(threshold), "--json"]) == 1
    need = json.loads(capsys.readouterr().out)["min_budget_bytes"]
    assert f"would be {math.ceil(need / 1e4) / 100:.2f}MB" in err  # rounded up, as the error rounds
    assert main(["plan", *SMALL, "--budget", str(need), "--min-swap-bytes", str(threshold)]) == 0


@pytest.mark.parametrize("budget", ["12_000_000_000", "12000000000", "12GB", "12000MB"])
def test_budget_forms_from_the_command_line(budget, capsys) -> None:
    assert main(["plan", *SMALL, "--budget", budget, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_bytes"] == 12 * 10**9


def test_text_report_has_the_table_and_the_headline_figures(capsys) -> None:
    assert main(["plan", *SMALL, "--budget", "100%"]) == 0
    out = capsys.readouterr().out
    assert "decision" in out and "stem.0" in out  # the plan table
    for label in (
        "predicted peak",
        "predicted step",
        "vs unconstrained",
        "lower bound",
        "bound ratio",
        "smallest",
    ):
        assert label in out


@pytest.mark.parametrize("dtype", ["bf16", "bf16-true"])
def test_token_model_with_integer_input_and_bf16(capsys, dtype) -> None:
    args = [
        "plan",
        "tests.models:TinyGPT",
        "--input-shape",
        "16",
        "--input-dtype",
        "long",
        "--batch-size",
        "4",
    ]
    assert (
        main(
            [
                *args,
                "--budget",
                "1GB",
                "--gpu",
                "a100-80gb",
                "--dtype",
                dtype,
                "--optimizer",
                "sgd",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    check_plan_json(report, 10**9)
    assert report["dtype"] == dtype and report["input_shape"] == [16]
    assert report["layers"][0]["name"] == "embed"


def test_a_16_bit_step_reports_what_it_still_saves_in_float32(capsys) -> None:
    args = ["plan", "tests.models:upcasting_mlp", "--input-shape", "64", "--batch-size", "8"]
    args += ["--budget", "1GB", "--gpu", "h100"]
    assert main([*args, "--dtype", "bf16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    activation = 8 * 64 * 4  # the upcast's input to square, exp's float32 result
    assert report["float32_saved_bytes"] == 2 * activation < report["saved_bytes"]
    assert report["float32_saved_by_kind"] == [
        {"kind": "1", "bytes": activation, "layers": 1},
        {"kind": "3", "bytes": activation, "layers": 1},
    ]
    assert main([*args, "--dtype", "bf16"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("saved in float32")]
    assert row.endswith("4.10 KB (26%); most in 1 (2.05 KB, 1 layer), 3 (2.05 KB, 1 layer)")
    assert main(args) == 0  # fp32: every save is, and the row would say nothing
    assert "saved in float32" not in capsys.readouterr().out


@pytest.mark.skipif(HAS_MATPLOTLIB, reason="matplotlib is installed")
def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, capsys) -> None:
    assert main(["plan", *SMALL, "--budget", "1GB", "--plot", str(tmp_path / "m.png")]) == 2
    assert "pip install 'lightning-accudnn[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "m.png").exists()


def test_smallest_budget_is_one_number_whatever_the_budget_asked(capsys) -> None:
    """One smallest budget per model and batch: asked budgets that fit and one that does not
    name the same figure, and that figure plans."""
    named = set()
    for budget in ("1GB", "3MB", "100%"):
        code = main(["plan", *SMALL, "--budget", budget, "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == (0 if report["feasible"] else 1)
        named.add(report["min_budget_bytes"])
    (smallest,) = named
    assert main(["plan", *SMALL, "--budget", str(smallest), "--json"]) == 0
    check_plan_json(json.loads(capsys.readouterr().out), smallest)
    assert main(["plan", *SMALL, "--budget", str(smallest - 1), "--json"]) == 1


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib (the 'plot' extra)")
def test_plot_writes_a_png(tmp_path, capsys) -> None:
    path = tmp_path / "memory.png"
    assert main(["plan", *SMALL, "--budget", "1GB", "--plot", str(path)]) == 0
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_gpu_spec_feeds_the_profile_bandwidths() -> None:
    from lightning_accudnn.profiling.roofline import StepTrace

    profile = StepTrace((), (), 0, 0, 0).to_profile(get_gpu("h100"))
    assert (
        profile.d2h_bytes_per_second
        == profile.h2d_bytes_per_second
        == get_gpu("h100").host_link_bytes_per_second
    )


def test_help_lists_the_options(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--batch-size",
        "--budget",
        "--gpu",
        "--input-shape",
        "--dtype",
        "--grads",
        "--json",
        "--plot",
        "80%",
    ):
        assert option in out


@pytest.mark.slow
def test_the_process_entry_point_prints_what_main_prints_and_exits_with_its_status(capsys) -> None:
    """``python -m lightning_accudnn`` (:func:`lightning_accudnn.__main__.main`, which freezes the
    collector around the command) reports the same plan as :func:`lightning_accudnn.cli.main`."""
    args = ["plan", *SMALL, "--budget", "1GB", "--json"]
    assert main(args) == 0
    in_process = json.loads(capsys.readouterr().out)
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    fresh = json.loads(result.stdout)
    for report in (in_process, fresh):
        report.pop("trace_seconds")
    assert fresh == in_process
    assert run_cli("plan", *SMALL, "--budget", "1000").returncode == 1


def _reports_by(capsys, args: list[str], option: str, values: tuple[str, ...]) -> dict[str, dict]:
    """The JSON report of ``accudnn plan`` ``args`` with ``--option`` at each of ``values``, by
    value; each checked, and saying the value it ran with."""
    reports = {}
    for value in values:
        assert main([*args, f"--{option}", value, "--json"]) == 0
        reports[value] = json.loads(capsys.readouterr().out)
        check_plan_json(reports[value], 10**9)
        assert reports[value][option] == value
    return reports


def test_a_cross_entropy_loss_saves_its_float32_log_softmax_and_holds_more(capsys) -> None:
    """TinyGPT's 4 x 16 x 50 bf16 logits: under CUDA autocast the cross-entropy runs in float32,
    and its log-softmax saves a float32 copy of them for backward."""
    args = [*TINY_GPT, "--budget", "1GB"]
    reports = _reports_by(capsys, args, "loss", ("mean", "cross-entropy"))
    mean, cross_entropy = reports["mean"], reports["cross-entropy"]
    log_softmax = 4 * 16 * 50 * 4
    assert cross_entropy["saved_bytes"] >= mean["saved_bytes"] + log_softmax
    assert cross_entropy["float32_saved_bytes"] >= mean["float32_saved_bytes"] + log_softmax
    assert main([*args, "--loss", "cross-entropy"]) == 0
    assert "--loss cross-entropy" in capsys.readouterr().out


def test_gradients_set_to_none_are_made_in_backward_and_held_ones_counted_all_step(capsys) -> None:
    """TinyGPT's step peaks in its loss's backward, before any parameter's gradient is made: a
    step that sets them to None (the default) holds less there than one that holds them."""
    args = [*TINY_GPT, "--budget", "1GB", "--loss", "cross-entropy"]
    reports = _reports_by(capsys, args, "grads", ("set-to-none", "held"))
    to_none, held = reports["set-to-none"], reports["held"]
    assert to_none["static_bytes"] == held["static_bytes"]  # the model state counts them all step
    assert to_none["unconstrained_peak_bytes"] < held["unconstrained_peak_bytes"]
    # In forward no gradient is made yet: a level holds all of them less (a layer with no
    # reading of its own lists the workspaces alone either way).
    grads = held["static_bytes"] // 4  # parameters, gradients, two Adam moments: all float32
    less = {
        h["forward_working_bytes"] - n["forward_working_bytes"]
        for n, h in zip(to_none["layers"], held["layers"], strict=True)
    }
    assert grads in less and less <= {0, grads}
    assert main(args) == 0
    assert "--grads set-to-none: each gradient counted from its making in backward" in capsys.readouterr().out


def test_a_torchvision_vision_transformer_is_built_for_the_input_shape_given(capsys) -> None:
    """A vision transformer's image size is fixed when it is built: the model is built for the
    shape named, not torchvision's default 224 (which its forward would refuse)."""
    args = ["plan", "torchvision:vit_b_16", "--input-shape", "3,64,64", "--batch-size", "2", "--gpu", "h100"]
    assert main([*args, "--budget", "80GB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["input_shape"] == [3, 64, 64]


def test_a_torchvision_model_loads_no_weights_not_even_its_backbone_s(capsys, monkeypatch) -> None:
    """A segmentation model's builder loads (downloads) its backbone's weights unless told not to."""
    import torchvision

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", refuse)
    args = ["plan", "torchvision:lraspp_mobilenet_v3_large", "--input-shape", "3,64,64", "--batch-size", "2"]
    assert main([*args, "--gpu", "h100", "--budget", "80GB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [3, 64, 64]


def test_a_torchvision_video_classifier_defaults_to_clips_of_sixteen_frames(capsys) -> None:
    args = ["plan", "torchvision:r3d_18", "--batch-size", "1", "--gpu", "h100", "--budget", "80GB"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [3, 16, 112, 112]
