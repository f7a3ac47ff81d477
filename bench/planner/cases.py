"""The models of the planner table, traced as ``accudnn plan`` traces them.

Example:
    >>> from lightning_accudnn.profiling.gpus import get_gpu
    >>> traced = trace_case(CASES["tiny"], get_gpu("h100"))
    >>> traced.profile.saved_bytes == traced.trace.saved_bytes > 0
    True
    >>> traced.kernels["scaled_dot_product_attention"]
    {'cudnn': 4}
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lightning_accudnn.cli import INPUT_DTYPES, assumed_kernels, resolve_model
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.ops.working_memory import WorkingMemoryMeter
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.profiling.gpus import GpuSpec
from lightning_accudnn.profiling.roofline import StepTrace
from lightning_accudnn.profiling.trace import trace_step

__all__ = ["CASES", "TABLE_CASES", "Case", "TracedCase", "trace_case"]

#: The CLI's default optimizer: Adam's two moments count in the static bytes.
OPTIMIZER = "adam"


@dataclass(frozen=True)
class Case:
    """One model at one batch and precision: the arguments of ``accudnn plan`` for it.

    Example:
        >>> CASES["gpt2-medium-bf16"].command("h100")[:3]
        ['plan', 'bench.planner.models:gpt2_medium', '--batch-size']
    """

    key: str
    title: str
    model: str
    batch_size: int
    input_shape: tuple[int, ...]
    input_dtype: str = "float32"
    dtype: str = "fp32"

    def command(self, gpu: str, budget: str = "80GB") -> list[str]:
        """``accudnn plan`` arguments that trace and plan this case (for ``bench.planner.speed``)."""
        shape = ",".join(str(size) for size in self.input_shape)
        return [
            "plan", self.model, "--batch-size", str(self.batch_size), "--input-shape", shape,
            "--input-dtype", self.input_dtype, "--dtype", self.dtype, "--gpu", gpu, "--budget", budget,
        ]  # fmt: skip


CASES = {
    case.key: case
    for case in (
        Case(
            "resnet152-bf16",
            "ResNet-152, batch 64, bf16",
            "torchvision:resnet152",
            64,
            (3, 224, 224),
            dtype="bf16",
        ),
        Case(
            "gpt2-medium-bf16",
            "GPT-2 medium (HF, SDPA), 8 x 1024 tokens, bf16",
            "bench.planner.models:gpt2_medium",
            8,
            (1024,),
            "long",
            "bf16",
        ),
        Case(
            "gpt2-medium-gelu-tanh-bf16",
            "GPT-2 medium, gelu_pytorch_tanh (HF, SDPA), 8 x 1024 tokens, bf16",
            "bench.planner.models:gpt2_medium_gelu_tanh",
            8,
            (1024,),
            "long",
            "bf16",
        ),
        Case(
            "llama-1b-bf16",
            "Llama-style 1B (HF, SDPA), 4 x 2048 tokens, bf16",
            "bench.planner.models:llama_1b",
            4,
            (2048,),
            "long",
            "bf16",
        ),
        Case(
            "resnet152-channels-last-bf16",
            "ResNet-152 in channels-last memory, batch 64, bf16",
            "bench.planner.models:resnet152_channels_last",
            64,
            (3, 224, 224),
            dtype="bf16",
        ),
        Case("resnet152-fp32", "ResNet-152, batch 64, fp32", "torchvision:resnet152", 64, (3, 224, 224)),
        Case(
            "tiny",
            "tiny transformer (tests), 128 x 512 tokens, bf16",
            "bench.planner.models:tiny_transformer",
            128,
            (512,),
            "long",
            "bf16",
        ),  # fmt: skip
    )
}
#: The cases ``python -m bench.planner`` plans by default (``tiny`` is for tests).
TABLE_CASES = ("resnet152-bf16", "gpt2-medium-bf16", "llama-1b-bf16", "resnet152-fp32")


@dataclass(frozen=True)
class TracedCase:
    """A case traced for a GPU: the trace, the planner's profile, the kernels assumed, the time taken."""

    case: Case
    trace: StepTrace
    profile: StepProfile
    kernels: dict[str, dict[str, int]]
    trace_seconds: float


def trace_case(case: Case, gpu: GpuSpec) -> TracedCase:
    """Trace ``case`` for ``gpu`` and make its profile, with the CLI's defaults (Adam, 1 MiB, the
    working memory at each layer's levels counted, the mean of the outputs as the loss)."""
    spec = resolve_model(case.model)
    started = time.perf_counter()
    trace = trace_step(
        spec.builder(case.input_shape),
        (case.batch_size, *case.input_shape),
        tracker=LayerTracker(),
        input_dtype=INPUT_DTYPES[case.input_dtype],
        dtype=case.dtype,
        gpu=gpu,
        meter=WorkingMemoryMeter,
    )
    seconds = time.perf_counter() - started
    return TracedCase(
        case, trace, trace.to_profile(gpu, optimizer=OPTIMIZER), assumed_kernels(trace), seconds
    )
