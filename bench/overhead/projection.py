"""The H100 step the planner predicts for a real-size model (a datasheet estimate, not a measurement).

Runs ``python -m lightning_accudnn plan MODEL --gpu h100 --budget 100% --json`` in this
process (the CLI's public entry point): the model is traced under fake tensors and timed
from the H100's datasheet figures. At the whole card as budget nothing is swapped, so the
predicted step is the unconstrained one.

Example:
    >>> target = PlanTarget("gpt-2 layers", "bench.overhead.models:gpt2_medium", batch_size=1,
    ...                     input_shape="8", input_dtype="long", dtype="bf16", optimizer="adamw")
    >>> target.argv()[:4]
    ['plan', 'bench.overhead.models:gpt2_medium', '--batch-size', '1']
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from typing import Any

from lightning_accudnn import cli

GPU = "h100"
SOURCE = (
    "lightning_accudnn planner (python -m lightning_accudnn plan --gpu h100 --json): a datasheet "
    "estimate from a fake-tensor trace, not a GPU measurement"
)


@dataclass(frozen=True)
class PlanTarget:
    """A real-size model for the planner: its CLI name, batch, input, precision and optimizer."""

    name: str
    model: str
    batch_size: int
    input_shape: str | None = None
    input_dtype: str = "float32"
    dtype: str = "fp32"
    optimizer: str = "adam"

    def argv(self) -> list[str]:
        argv = ["plan", self.model, "--batch-size", str(self.batch_size), "--budget", "100%"]
        argv += ["--gpu", GPU, "--dtype", self.dtype, "--optimizer", self.optimizer, "--json"]
        if self.input_shape is not None:
            argv += ["--input-shape", self.input_shape]
        return argv + ["--input-dtype", self.input_dtype]


#: The real sizes: ResNet-152 at batch 64 (224x224, fp32, SGD), GPT-2 medium at batch 8 (1024 tokens, bf16).
REAL_TARGETS = {
    "resnet152": PlanTarget(
        "ResNet-152, batch 64, 224x224, fp32", "torchvision:resnet152", 64, optimizer="sgd"
    ),
    "gpt2_medium": PlanTarget(
        "GPT-2 medium, batch 8, 1024 tokens, bf16",
        "bench.overhead.models:gpt2_medium",
        8,
        input_shape="1024",
        input_dtype="long",
        dtype="bf16",
        optimizer="adamw",
    ),
}


def predict(target: PlanTarget) -> dict[str, Any]:
    """The planner's H100 step for ``target``: seconds, the command and what the figure is."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = cli.main(target.argv())
    lines = output.getvalue().strip().splitlines()
    if status != 0 or not lines:
        raise RuntimeError(f"accudnn plan for {target.model} exited {status}: {output.getvalue()[-500:]}")
    report = json.loads(lines[-1])
    return {
        "target": target.name,
        "command": "python -m lightning_accudnn " + " ".join(target.argv()),
        "gpu": report["gpu"],
        "predicted_step_seconds": report["predicted_step_seconds"],
        "swapped_bytes": report["swapped_bytes"],
        "source": SOURCE,
    }
