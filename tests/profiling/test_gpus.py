"""The GPU table: lookups, datasheet sanity, host links."""

from __future__ import annotations

import pytest

from lightning_accudnn.profiling.gpus import GPUS, get_gpu, gpu_choices


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100", "H100 SXM 80GB"),
        ("H100-SXM", "H100 SXM 80GB"),
        ("h100_pcie", "H100 PCIe 80GB"),
        ("H200", "H200 SXM 141GB"),
        ("a100", "A100 SXM 40GB"),
        ("A100-80GB", "A100 SXM 80GB"),
        ("l4", "L4 24GB"),
        ("RTX 4090", "GeForce RTX 4090 24GB"),
        ("v100", "V100 SXM2 16GB"),
        ("v100-32gb", "V100 SXM2 32GB"),
        ("H100 SXM 80GB", "H100 SXM 80GB"),
    ],
)
def test_names_and_aliases_ignore_case_and_separators(name: str, expected: str) -> None:
    assert get_gpu(name).name == expected


def test_unknown_gpu_lists_every_choice() -> None:
    with pytest.raises(ValueError, match="unknown GPU 'b200'") as error:
        get_gpu("b200")
    for choice in gpu_choices():
        assert choice in str(error.value)


def test_aliases_are_unique() -> None:
    assert len(gpu_choices()) == len(set(gpu_choices()))


@pytest.mark.parametrize("spec", GPUS, ids=lambda spec: spec.name)
def test_specs_are_consistent(spec) -> None:
    assert spec.memory_bytes >= 16 * 2**30
    assert spec.fp32_flops > 10e12
    for rate in (spec.tf32_flops, spec.bf16_flops, spec.fp16_flops):
        assert rate is None or rate >= spec.fp32_flops
    assert 0 < spec.efficiency <= 1
    # Pinned copies: 80% of the x16 link's theoretical rate per direction.
    expected = {3: 12.6e9, 4: 25.2e9, 5: 50.4e9}[spec.pcie_gen]
    assert spec.host_link_bytes_per_second == pytest.approx(expected, rel=1e-3)
    assert spec.memory_bytes_per_second > 10 * spec.host_link_bytes_per_second
    assert spec.datasheet


def test_rates_by_dtype() -> None:
    h100, v100 = get_gpu("h100"), get_gpu("v100")
    assert h100.peak_flops("bf16") == pytest.approx(989.5e12)
    assert h100.peak_flops("fp32") == 67e12
    assert h100.peak_flops("fp32", convolution=True) == pytest.approx(494.5e12)  # TF32, cuDNN's default
    assert v100.peak_flops("bf16") == v100.fp32_flops  # no bf16 tensor cores
    assert v100.peak_flops("fp16") == 125e12
    assert v100.peak_flops("fp32", convolution=True) == v100.fp32_flops  # no TF32
