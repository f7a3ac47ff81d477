"""``accudnn plan``: plan a model for a GPU you do not have, on a laptop CPU.

The model is traced under fake tensors (no memory is allocated, see
:mod:`lightning_accudnn.profiling.trace`), timed for the chosen GPU's datasheet figures and
handed to the swap planner. Exit status: 0 planned, 1 the budget cannot fit the step (the
message gives the smallest budget that would), 2 a usage error (unknown model, GPU, budget,
missing ``--input-shape`` or missing ``matplotlib`` for ``--plot``).

Example:
    $ accudnn plan torchvision:resnet152 --batch-size 64 --budget 8GB --gpu h100
    $ accudnn plan mypkg.models:build_gpt --input-shape 1024 --input-dtype long \\
          --batch-size 8 --budget 20GB --gpu a100-40gb --dtype bf16 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.planner.budget import ACCEPTED_FORMS, Budget, format_bytes
from lightning_accudnn.planner.plan import BudgetTooSmallError, Plan, plan_swaps
from lightning_accudnn.planner.refusals import named_for_reserve
from lightning_accudnn.planner.search import POLICIES
from lightning_accudnn.planner.timeline import PlanChoice, Simulator, Timeline, unconstrained_seconds
from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES, StepProfile
from lightning_accudnn.profiling.gpus import GpuSpec, get_gpu, gpu_choices
from lightning_accudnn.profiling.roofline import StepTrace
from lightning_accudnn.profiling.static_memory import NAMED_OPTIMIZERS
from lightning_accudnn.profiling.trace import DTYPES, LOSSES, trace_step
from lightning_accudnn.session.compiled import route_of, whole_model_form
from lightning_accudnn.session.config import default_reserve_bytes, smallest_budget_bytes

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_USAGE = 2

#: ``--reserve``'s default: the reserve a training session keeps by default on a GPU.
AUTO_RESERVE = "auto"

#: How the step finds the parameters' gradients (``--grads``): set to ``None``, or held all step.
GRADS = ("set-to-none", "held")

#: Input shape (without the batch dimension) used for torchvision models by default.
DEFAULT_IMAGE_SHAPE = (3, 224, 224)
#: Frames per clip of a torchvision video classifier's input by default.
DEFAULT_CLIP_FRAMES = 16

INPUT_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "long": torch.int64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int": torch.int32,
}


class UsageError(Exception):
    """A mistake in the command line; the message says what to write instead.

    Example:
        >>> str(UsageError("unknown GPU 'tpu'"))
        "unknown GPU 'tpu'"
    """


#: torchvision's models whose image size is fixed when they are built, by their builders'
#: module: the argument that sets it (an int for square images, else a (height, width) pair).
_IMAGE_SIZE_ARGUMENTS = {
    "torchvision.models.vision_transformer": "image_size",
    "torchvision.models.maxvit": "input_size",
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model named on the command line: how to build it and its default input shape.

    ``build`` builds it as named; ``sized_build``, where set, builds it for one sample's shape
    (a torchvision vision transformer's image size is fixed when it is built).

    Example:
        >>> spec = resolve_model("torchvision:resnet18")
        >>> spec.name, spec.default_input_shape
        ('torchvision:resnet18', (3, 224, 224))
        >>> with torch.device("meta"):
        ...     resolve_model("torchvision:vit_b_16").builder((3, 384, 384))().image_size
        384
    """

    name: str
    build: Callable[[], nn.Module]
    default_input_shape: tuple[int, ...] | None = None
    sized_build: Callable[[tuple[int, ...]], nn.Module] | None = None

    def builder(self, sample_shape: tuple[int, ...]) -> Callable[[], nn.Module]:
        """How to build the model for samples of ``sample_shape`` (without the batch)."""
        sized = self.sized_build
        if sized is None:
            return self.build
        return lambda: sized(sample_shape)


def resolve_model(name: str) -> ModelSpec:
    """``torchvision:NAME`` (no weights) or ``package.module:factory`` (a callable returning
    an ``nn.Module``, importable from the current directory).

    Raises :class:`UsageError` for an unknown model, listing the choices where there are.

    Example:
        >>> resolve_model("torchvision:resnet1234")
        Traceback (most recent call last):
        ...
        lightning_accudnn.cli.UsageError: unknown torchvision model 'resnet1234'; choose one of: ...
    """
    source, sep, attribute = name.partition(":")
    if not sep or not source or not attribute:
        raise UsageError(
            f"cannot read model {name!r}: write torchvision:NAME (e.g. torchvision:resnet152) "
            "or package.module:factory (a callable returning an nn.Module)"
        )
    if source == "torchvision":
        try:
            import torchvision
        except ImportError as error:
            raise UsageError(
                "torchvision is not installed: pip install torchvision (or lightning-accudnn[examples])"
            ) from error
        choices = torchvision.models.list_models()
        if attribute not in choices:
            raise UsageError(f"unknown torchvision model {attribute!r}; choose one of: {', '.join(choices)}")

        builder = torchvision.models.get_model_builder(attribute)
        # No weights: a segmentation or detection model's backbone would load (and download) its own.
        no_weights: dict[str, Any] = {"weights": None}
        if "weights_backbone" in inspect.signature(builder).parameters:
            no_weights["weights_backbone"] = None

        def build() -> nn.Module:
            return torchvision.models.get_model(attribute, **no_weights)

        sized_build = None
        argument = _IMAGE_SIZE_ARGUMENTS.get(builder.__module__)
        if argument is not None:

            def sized_build(shape: tuple[int, ...]) -> nn.Module:
                size: int | tuple[int, ...] = shape[-2:] if argument == "input_size" else shape[-2]
                return torchvision.models.get_model(attribute, **no_weights, **{argument: size})

        return ModelSpec(name, build, _torchvision_input_shape(torchvision, attribute), sized_build)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as ``python -m`` would: models of the project at hand
    try:
        module = importlib.import_module(source)
    except ImportError as error:
        raise UsageError(f"cannot import module {source!r} for model {name!r}: {error}") from error
    factory = getattr(module, attribute, None)
    if not callable(factory):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise UsageError(
            f"module {source!r} has no callable {attribute!r}; callables there: {', '.join(public) or 'none'}"
        )
    return ModelSpec(name, factory)


def _torchvision_input_shape(torchvision: Any, name: str) -> tuple[int, ...]:
    """The crop size of the model's default weights for image classifiers (299 for
    Inception v3, 518 for ViT-H/14); for video classifiers, clips of :data:`DEFAULT_CLIP_FRAMES`
    frames (at least the weights' ``min_temporal_size``) at that crop size; else 3x224x224.

    Example:
        >>> import torchvision
        >>> [_torchvision_input_shape(torchvision, name) for name in ("inception_v3", "r3d_18")]
        [(3, 299, 299), (3, 16, 112, 112)]
    """
    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
        transforms = weights.transforms()
        kind = type(transforms).__name__
        if kind in ("ImageClassification", "VideoClassification"):
            crop = [int(size) for size in transforms.crop_size]  # (size,) or (height, width)
            height, width = crop[0], crop[-1]
            if kind == "ImageClassification":
                return (3, height, width)
            frames = max(DEFAULT_CLIP_FRAMES, int(weights.meta.get("min_temporal_size", 1)))
            return (3, frames, height, width)
    except Exception:  # no weights enum, or a transform of another kind: keep the default
        pass
    return DEFAULT_IMAGE_SHAPE


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        shape = ()
    if not shape or any(size <= 0 for size in shape):
        raise argparse.ArgumentTypeError(
            f"cannot read shape {text!r}: write positive sizes such as 3,224,224"
        )
    return shape


def build_parser() -> argparse.ArgumentParser:
    """The ``accudnn`` argument parser (sub-command ``plan``).

    Example:
        >>> args = build_parser().parse_args(["plan", "torchvision:resnet18", "--batch-size", "8",
        ...                                   "--budget", "4GB", "--gpu", "l4"])
        >>> args.batch_size, args.dtype, args.optimizer
        (8, 'fp32', 'adam')
    """
    parser = argparse.ArgumentParser(
        prog="accudnn",
        description="AccUDNN: fit a training step into a GPU memory budget by swapping activations.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser(
        "plan",
        help="plan a model for a GPU from its datasheet figures, on this machine's CPU",
        description=(
            "Trace one training step under fake tensors (no memory is used), time it for the GPU's "
            "datasheet figures and choose which layers' saved activations to swap to host memory so "
            "the step fits the budget."
        ),
    )
    plan.add_argument("model", help="torchvision:NAME or package.module:factory")
    plan.add_argument("--batch-size", type=int, required=True, help="samples per step")
    plan.add_argument(
        "--budget", required=True, help="device memory budget: " + ACCEPTED_FORMS.replace("%", "%%")
    )
    plan.add_argument("--gpu", required=True, help=f"GPU to plan for: {', '.join(gpu_choices())}")
    plan.add_argument(
        "--input-shape",
        type=_parse_shape,
        default=None,
        help="one sample's shape without the batch dimension, e.g. 1024 (tokens); torchvision "
        "models default to their weights' crop size (3,224,224 for most; video: 3,16,H,W)",
    )
    plan.add_argument(
        "--input-dtype",
        choices=sorted(INPUT_DTYPES),
        default="float32",
        help="dtype of the input batch; integer inputs (token ids) are zeros",
    )
    plan.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="fp32",
        help="fp32; bf16/fp16 mixed precision (autocast, fp32 parameters, as Lightning's "
        "'bf16-mixed'); or bf16-true/fp16-true (the model in that dtype, as Lightning's 'bf16-true')",
    )
    plan.add_argument(
        "--loss",
        choices=sorted(LOSSES),
        default="mean",
        help="the loss the traced step ends with: the mean of the outputs, or a cross-entropy over "
        "the first (logits, classes last: what a classifier or a language model holds for its loss)",
    )
    plan.add_argument(
        "--grads",
        choices=GRADS,
        default="set-to-none",
        help="set-to-none: the step starts with the gradients set to None (zero_grad()'s default, and "
        "Lightning's), so backward makes each; held: they are held all step (zeroed in place, or "
        "accumulated over several batches)",
    )
    plan.add_argument(
        "--optimizer",
        choices=sorted(NAMED_OPTIMIZERS),
        default="adam",
        help="optimizer state: adam/adamw two copies of the parameters, sgd none, sgd-momentum one",
    )
    plan.add_argument(
        "--min-swap-bytes",
        type=int,
        default=DEFAULT_MIN_SWAP_BYTES,
        help="saved tensors smaller than this stay on the device (default 1 MiB, as the engine)",
    )
    plan.add_argument(
        "--reserve",
        default="auto",
        help="bytes of the budget kept free for fragmentation and what the model of the step misses "
        "(e.g. 500MB, 0); auto: a training session's default on a GPU, the larger of 256 MiB and 5%% "
        "of the budget, so that the smallest budget named is one a session with its default reserve "
        "accepts",
    )
    plan.add_argument(
        "--policy",
        choices=POLICIES,
        default="auto",
        help="auto: keep, swap or recompute each segment, whichever is fastest; swap: keep or swap "
        "only; recompute: keep or recompute only; selective: keep or recompute selectively only (keep "
        "what matmuls, convolutions and attention write, recompute the other ops)",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    plan.add_argument(
        "--plot", metavar="FILE.png", help="draw the predicted memory timeline (needs matplotlib)"
    )
    return parser


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"accudnn: error: {message}", file=sys.stderr)
    return code


def _size_spec(text: str) -> int | str:
    """A command-line size as :meth:`Budget.parse` wants it: digits (``_`` allowed) as an int."""
    digits = text.strip().replace("_", "")
    return int(digits) if digits.isdigit() else text


def _reserve_bytes(text: str, budget_bytes: int) -> int:
    """``--reserve``: ``auto`` is a training session's default reserve on a GPU for the budget."""
    if text.strip() == AUTO_RESERVE:
        return default_reserve_bytes(budget_bytes, "cuda")
    if text.strip() in {"0", ""}:
        return 0
    return Budget.parse(_size_spec(text)).resolve(2**63)


def _budget_for(usable_bytes: int, reserve_text: str, reserve_bytes: int) -> int:
    """The smallest budget whose part left to plans holds ``usable_bytes`` under ``--reserve``."""
    if reserve_text.strip() == AUTO_RESERVE:
        return smallest_budget_bytes(usable_bytes, "cuda")
    return usable_bytes + reserve_bytes


def plan_command(args: argparse.Namespace) -> int:
    """Run ``accudnn plan`` for parsed arguments; returns the exit status."""

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib: pip install 'lightning-accudnn[plot]'")
    if args.batch_size <= 0:
        return _fail(f"--batch-size must be positive, got {args.batch_size}")
    try:
        gpu = get_gpu(args.gpu)
        budget = Budget.parse(_size_spec(args.budget))
        budget_bytes = budget.resolve(gpu.memory_bytes, device_name=gpu.name)
        reserve = _reserve_bytes(args.reserve, budget_bytes)
        model = resolve_model(args.model)
    except (ValueError, UsageError) as error:
        return _fail(str(error))
    shape = args.input_shape or model.default_input_shape
    if shape is None:
        return _fail(
            f"{args.model} needs --input-shape (one sample's shape without the batch, e.g. 3,224,224)"
        )

    if args.dtype != "fp32" and gpu.peak_flops(args.dtype.removesuffix("-true")) == gpu.fp32_flops:
        print(
            f"accudnn: warning: {gpu.name} has no {args.dtype} tensor cores; timed at the fp32 rate",
            file=sys.stderr,
        )
    started = time.perf_counter()
    built: list[nn.Module] = []  # the model traced: its route is read from it

    build_model = model.builder(shape)

    def build() -> nn.Module:
        built.append(build_model())
        return built[-1]

    try:
        trace = trace_step(
            build,
            (args.batch_size, *shape),
            tracker=LayerTracker(),
            input_dtype=INPUT_DTYPES[args.input_dtype],
            dtype=args.dtype,
            gpu=gpu,
            loss=args.loss,
            meter=WorkingMemoryMeter,
            set_grads_to_none=args.grads == "set-to-none",
        )
    except Exception as error:  # a model that cannot be traced: say which and why
        batch_shape = (args.batch_size, *shape)
        return _fail(
            f"cannot trace {args.model} on a batch of {batch_shape}: {type(error).__name__}: {error}"
        )
    trace_seconds = time.perf_counter() - started
    form = whole_model_form(built[-1])
    if form is not None:
        return _fail(
            f"{args.model} is compiled whole ({form}): traced here it is one layer, so no per-layer plan "
            "can be made from it. Plan the model uncompiled (a factory without torch.compile or "
            "model.compile()), or compile its blocks one by one (route: regional compile). In training, "
            "whole_model_compile='experimental' (PyTorch 2.14.1) plans a model compiled whole itself, from "
            "the bytes its compiled graph saves per layer in its first step."
        )
    profile = trace.to_profile(gpu, optimizer=args.optimizer, min_swap_bytes=args.min_swap_bytes)
    baseline = unconstrained_seconds(profile)
    header = {
        "model": args.model,
        "gpu": gpu.name,
        "batch_size": args.batch_size,
        "input_shape": list(shape),
        "dtype": args.dtype,
        "optimizer": args.optimizer,
        "loss": args.loss,
        "grads": args.grads,
        "budget": str(budget),
        "budget_bytes": budget_bytes,
        "reserve_bytes": reserve,
        "static_bytes": profile.static_bytes,
        "saved_bytes": profile.saved_bytes,
        "swappable_bytes": profile.swappable_bytes,
        "float32_saved_bytes": trace.float32_saved_bytes,
        "float32_saved_by_kind": [
            {"kind": kind, "bytes": nbytes, "layers": layers}
            for kind, nbytes, layers in trace.float32_saved_by_kind()
        ],
        "working_bytes": trace.working_bytes,
        "unconstrained_peak_bytes": _unconstrained_peak_bytes(profile),
        "unconstrained_step_seconds": baseline,
        "forward_flops": trace.forward_flops,
        "backward_flops": trace.backward_flops,
        "host_link_bytes_per_second": gpu.host_link_bytes_per_second,
        "trace_seconds": trace_seconds,
        "assumed_kernels": assumed_kernels(trace),
    }
    try:
        plan = plan_swaps(profile, budget_bytes, reserve_bytes=reserve, policy=args.policy)
        smallest = _budget_for(plan.min_budget_bytes - reserve, args.reserve, reserve)
        plan = dataclasses.replace(plan, route=route_of(built[-1]), min_budget_bytes=smallest)
    except BudgetTooSmallError as refusal:
        named = named_for_reserve(refusal, lambda usable: _budget_for(usable, args.reserve, reserve))
        need = named.min_budget_bytes
        if args.json:
            layers = [{**dataclasses.asdict(layer), "swap": None} for layer in profile.layers]
            least = {"min_budget_bytes": need, "profiling_binds": named.profiling_binds}
            print(json.dumps({**header, "feasible": False, **least, "layers": layers}))
        return _fail(
            f"{args.model}, batch {args.batch_size}, on {gpu.name}: {named}\n"
            f"accudnn: the smallest budget that fits is {need} bytes: rerun with --budget {need}",
            EXIT_INFEASIBLE,
        )
    report = {**header, "feasible": True, **plan.to_dict()}
    report["saved_peak_bytes"] = plan.predicted_ledger_peak_bytes  # as the engine's ledger counts it
    for row, layer in zip(report["layers"], profile.layers, strict=True):
        row["forward_working_bytes"] = layer.forward_working_bytes
        row["backward_working_bytes"] = layer.backward_working_bytes
    report["overhead_vs_unconstrained"] = plan.predicted_step_seconds / baseline - 1 if baseline > 0 else 0.0
    if args.plot:
        assert plan.timeline is not None  # plan_swaps always simulates the plan it returns
        title = f"{args.model} batch {args.batch_size} on {gpu.name}, budget {format_bytes(budget_bytes)}"
        save_memory_plot(plan.timeline, args.plot, title=title, budget_bytes=budget_bytes)
        report["plot"] = args.plot
    if args.json:
        print(json.dumps(report))
    else:
        print(_text_report(plan, report, gpu, trace))
    return EXIT_OK


_GRADS_TEXT = {"set-to-none": "each gradient counted from its making in backward", "held": "held all step"}


def _unconstrained_peak_bytes(profile: StepProfile) -> int:
    """The predicted peak with every layer kept and nothing recomputed."""
    return Simulator(profile).memory(PlanChoice((False,) * len(profile.layers), 0, 0)).peak_bytes


def _most_working(profile: StepProfile) -> str:
    """Where the layers' levels hold most working memory: ``"; most in ..."``, or nothing."""
    forward = max(profile.layers, key=lambda layer: layer.forward_working_bytes, default=None)
    backward = max(profile.layers, key=lambda layer: layer.backward_working_bytes, default=None)
    if forward is None or backward is None:
        return ""
    return (
        f"; most in the forward of {forward.name!r} ({format_bytes(forward.forward_working_bytes)}) "
        f"and the backward of {backward.name!r} ({format_bytes(backward.backward_working_bytes)})"
    )


def assumed_kernels(trace: StepTrace) -> dict[str, dict[str, int]]:
    """The kernels the trace assumed where the CPU's would save other tensors than the GPU's:
    op, then kernel, then calls (what ``--json`` reports as ``assumed_kernels``).

    Example:
        >>> from lightning_accudnn.profiling.roofline import StepTrace
        >>> trace = StepTrace((), (), 0, 0, 0, kernels=(("scaled_dot_product_attention", "cudnn", 24),))
        >>> assumed_kernels(trace)
        {'scaled_dot_product_attention': {'cudnn': 24}}
    """
    kernels: dict[str, dict[str, int]] = {}
    for op, kernel, calls in trace.kernels:
        kernels.setdefault(op, {})[kernel] = calls
    return kernels


def _kernels_text(kernels: dict[str, dict[str, int]]) -> str:
    if not kernels:
        return "none to choose (no attention or dropout)"
    return "; ".join(
        f"{op}: " + ", ".join(f"{kernel} x{calls}" for kernel, calls in by_kernel.items())
        for op, by_kernel in kernels.items()
    )


def _float32_rows(report: dict) -> list[tuple[str, str]]:
    """Under a 16-bit precision, the saves still in float32 and the layers that hold most."""
    float32, saved = report["float32_saved_bytes"], report["saved_bytes"]
    if report["dtype"] == "fp32" or not float32:
        return []
    most = ", ".join(
        f"{kind['kind']} ({format_bytes(kind['bytes'])}, {kind['layers']} "
        f"{'layer' if kind['layers'] == 1 else 'layers'})"
        for kind in report["float32_saved_by_kind"][:3]
    )
    return [("saved in float32", f"{format_bytes(float32)} ({float32 / saved:.0%}); most in {most}")]


def _flops(count: int) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} FLOP"


def _text_report(plan: Plan, report: dict, gpu: GpuSpec, trace: StepTrace) -> str:
    def gb(key: str) -> str:
        return format_bytes(report[key])

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.1f} ms"

    shape = "x".join(str(size) for size in report["input_shape"])
    rows = [
        ("model", f"{report['model']}, batch {report['batch_size']} of {shape}, {report['dtype']}"),
        ("optimizer", report["optimizer"]),
        ("gpu", f"{gpu.name} ({gpu.memory_bytes / 2**30:g} GiB)"),
        ("host link", f"{format_bytes(gpu.host_link_bytes_per_second)}/s per direction (pinned PCIe)"),
        ("budget", f"{report['budget']} = {gb('budget_bytes')}"),
        (
            "static memory",
            f"{gb('static_bytes')} (parameters, gradients, optimizer state, buffers; --grads "
            f"{report['grads']}: {_GRADS_TEXT[report['grads']]})",
        ),
        ("saved activations", f"{gb('saved_bytes')} ({gb('swappable_bytes')} swappable)"),
        *_float32_rows(report),
        (
            "unconstrained",
            f"peak {gb('unconstrained_peak_bytes')}, step {ms(report['unconstrained_step_seconds'])} "
            "(each kernel at its datasheet roofline: no launch or host time)",
        ),
        (
            "working memory",
            f"{gb('working_bytes')} at most at once besides the saves (outputs nothing saves, the loss "
            f"and its gradient, the activations' gradients; --loss {report['loss']}); the plan adds to "
            f"each layer's levels what the step holds beyond them then{_most_working(plan.profile)}",
        ),
        (
            "predicted peak",
            f"{gb('predicted_peak_bytes')} ({gb('saved_peak_bytes')} as the engine's ledger counts it: "
            "model state and saved activations)",
        ),
        (
            "predicted step",
            f"{ms(plan.predicted_step_seconds)} "
            f"({report['overhead_vs_unconstrained'] * 100:+.1f}% vs unconstrained)",
        ),
        (
            "policy",
            f"{plan.policy}: {len(plan.recomputed)} segments recomputed ({len(plan.profile.segments)} "
            f"candidates), adding {ms(plan.recompute_seconds)} to backward",
        ),
        (
            "lower bound",
            f"{ms(plan.lower_bound_seconds)} (bound ratio {plan.bound_ratio:.3f}; assumes "
            f"{report['lower_bound_assumes']})",
        ),
        (
            "smallest budget",
            f"{gb('min_budget_bytes')} (with its reserve; the profiling pass, every activation swapped "
            f"and none recomputed, peaks at {gb('profiling_peak_bytes')}; no budget below it works)",
        ),
        ("kernels assumed", _kernels_text(report["assumed_kernels"])),
        (
            "traced in",
            f"{report['trace_seconds']:.1f} s ({_flops(trace.forward_flops)} forward, "
            f"{_flops(trace.backward_flops)} backward)",
        ),
    ]
    return "\n".join([str(plan), "", *(f"{label:<18} {value}" for label, value in rows)])


def save_memory_plot(timeline: Timeline, path: str, title: str = "", budget_bytes: int | None = None) -> None:
    """Draw the predicted device memory over one step into ``path`` (needs matplotlib).

    Example:
        >>> save_memory_plot(plan.timeline, "memory.png")  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times, values = timeline.memory_curve()
    figure, axes = plt.subplots(figsize=(10, 4))
    axes.step(
        [t * 1e3 for t in times], [v / 1e9 for v in values], where="post", label="predicted device memory"
    )
    axes.axhline(timeline.peak_bytes / 1e9, linestyle="--", color="gray", label="predicted peak")
    if budget_bytes is not None:
        axes.axhline(budget_bytes / 1e9, color="red", label="budget")
    axes.axvline(timeline.forward_seconds * 1e3, linestyle=":", color="black", label="forward ends")
    axes.set_xlabel("time in step (ms)")
    axes.set_ylabel("GB")
    axes.set_title(title)
    axes.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``accudnn`` and ``python -m lightning_accudnn``; returns the exit status.

    Example:
        >>> main(["plan", "torchvision:resnet18", "--batch-size", "8", "--budget", "4GB",
        ...       "--gpu", "tpu"])
        2
    """
    args = build_parser().parse_args(argv)
    if args.command == "plan":
        return plan_command(args)
    return _fail(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
