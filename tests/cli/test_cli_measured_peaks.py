"""``accudnn plan`` against the peaks an H200 measured for the same steps: never below, and close.

The figures are read from the H200's result files (``bench/results/nvidia-h200``): the headline's
plain GPT step (bf16, AdamW, 8 x 1024 tokens, cross-entropy) and the trace check's step of
Hugging Face GPT-2 medium (bf16, no optimizer, the mean loss), each after a warm-up step, the
gradients set to None.
"""

from __future__ import annotations

import json

import pytest

from lightning_accudnn.cli import main
from tests.cli.helpers import REPO

H200 = REPO / "bench" / "results" / "nvidia-h200" / "2026-11-26-at-ef99de4"
GPT = ["--batch-size", "8", "--input-shape", "1024", "--input-dtype", "long", "--dtype", "bf16"]
GPT += ["--budget", "80GB", "--gpu", "h200", "--json"]


def _planned_peak(capsys, model: str, *args: str) -> int:
    assert main(["plan", model, *GPT, *args]) == 0
    return int(json.loads(capsys.readouterr().out)["unconstrained_peak_bytes"])


@pytest.mark.slow
def test_the_headline_gpt_is_planned_at_or_above_its_measured_peak(capsys) -> None:
    measured = json.loads((H200 / "2026-11-26-headline-gpt2-medium-bf16.json").read_text())[
        "oracle_peak_bytes"
    ]
    planned = _planned_peak(
        capsys, "bench.planner.models:headline_gpt", "--optimizer", "adamw", "--loss", "cross-entropy"
    )
    assert measured <= planned <= 1.01 * measured


@pytest.mark.slow
def test_hugging_face_gpt2_medium_is_planned_at_or_above_its_measured_peak(capsys) -> None:
    pytest.importorskip("transformers")
    measured = json.loads((H200 / "2026-11-26-trace-check-gpt2-medium-bf16.json").read_text())
    planned = _planned_peak(capsys, "bench.planner.models:gpt2_medium", "--optimizer", "none")
    assert measured["peak_allocated_bytes"] <= planned <= 1.01 * measured["peak_allocated_bytes"]
