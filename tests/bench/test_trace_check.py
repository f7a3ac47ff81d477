"""bench.trace_check on the CPU: the files it writes, and its measurement counting what the trace counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from bench import trace_check
from bench.planner.cases import CASES

CPU = torch.device("cpu")


def test_it_writes_every_field_and_the_kinds_add_up_to_the_totals(tmp_path: Path) -> None:
    argv = ["--case", "tiny", "--device", "cpu", "--batch-size", "1", "--results-dir", str(tmp_path)]
    record = trace_check.main(argv)
    (written,) = (tmp_path / "cpu").glob("*-trace-check-tiny.json")
    data = json.loads(written.read_text())
    assert set(data) == {*trace_check.RECORD_FIELDS, "environment"}
    assert data["kind"] == "trace-check" and data["device"] == "cpu" and data["label"].startswith("CPU run")
    assert data["gpu"] == "H100 SXM 80GB" and data["batch_size"] == 1 and data["dtype"] == "bf16"
    assert data["assumed_kernels"]["scaled_dot_product_attention"] == {"cudnn": 4}
    assert data["traced_bytes"] > 0 and data["measured_bytes"] > 0
    assert data["ratio"] == data["measured_bytes"] / data["traced_bytes"]
    for total in ("traced_bytes", "measured_bytes"):
        assert sum(kind[total] for kind in data["kinds"]) == data[total]
        assert sum(layer[total] for layer in data["layers"]) == data[total]
    # Off CUDA there is no allocator to read.
    assert data["forward_allocated_bytes"] is None and data["peak_allocated_bytes"] is None
    blocks = {kind["kind"]: kind for kind in data["kinds"]}["blocks.*.norm1"]
    assert blocks["layers"] == 4
    text = written.with_suffix(".md").read_text()
    assert "traced for H100 SXM 80GB, measured on cpu" in text and "| total |" in text
    assert record["measured_bytes"] == data["measured_bytes"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_on_cpu_kernels_the_measurement_saves_what_the_trace_saves(dtype: str) -> None:
    case = dataclasses.replace(CASES["tiny"], batch_size=2, input_shape=(64,), dtype=dtype)
    record = trace_check.check(case, None, CPU)
    dropout_elements = 2 * 64 * 128  # the batch's tokens times the width
    dropouts = [layer for layer in record["layers"] if layer["name"].endswith(".mlp.3")]
    assert len(dropouts) == 4
    for layer in record["layers"]:
        if layer in dropouts:
            # The trace takes CUDA's fused dropout (a bool mask) on every device; the CPU's
            # dropout keeps a mask in the activation's dtype.
            mask_bytes = 4 if dtype == "fp32" else 2
            assert layer["traced_storages"] == [dropout_elements]
            assert layer["measured_storages"] == [mask_bytes * dropout_elements]
        else:
            assert layer["measured_storages"] == layer["traced_storages"], layer["name"]
    assert record["measured_bytes"] > 0


def test_a_convolutional_network_with_in_place_activations_counts_exactly() -> None:
    case = dataclasses.replace(
        CASES["resnet152-fp32"], model="torchvision:resnet18", batch_size=2, input_shape=(3, 32, 32)
    )
    record = trace_check.check(case, None, CPU)
    assert record["measured_bytes"] == record["traced_bytes"] > 0
    for layer in record["layers"]:
        assert layer["measured_storages"] == layer["traced_storages"], layer["name"]
    kinds = {kind["kind"]: kind for kind in record["kinds"]}
    assert kinds["layer1.*.conv1"]["layers"] == 2 and kinds["layer1.*.conv1"]["ratio"] == 1.0


def test_the_device_names_map_to_the_planners_gpus() -> None:
    assert trace_check.gpu_for_device("NVIDIA H100 80GB HBM3", 85_000_000_000).name == "H100 SXM 80GB"
    assert trace_check.gpu_for_device("NVIDIA A100-SXM4-40GB", 42_000_000_000).name == "A100 SXM 40GB"
    assert trace_check.gpu_for_device("NVIDIA GeForce RTX 4090").aliases[0] == "rtx4090"
    with pytest.raises(ValueError, match="pass --gpu NAME"):
        trace_check.gpu_for_device("AMD Instinct MI300X")
