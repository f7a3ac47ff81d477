"""Specifications of GPUs a user may plan for without owning one.

Every figure comes from the vendor's datasheet named next to it. NVIDIA datasheets list
tensor-core throughput *with 2:4 structured sparsity* (the figures marked ``*``); training
runs dense, so the dense figure used here is half of the listed one. Memory capacities are
the marketed sizes read as GiB (``nvidia-smi`` reports e.g. 81559 MiB for an H100 80GB: the
rest is reserved by the driver and ECC).

Host link: pinned host<->device copies go over PCIe whatever NVLink the card also has. The
theoretical rate per direction of an x16 link is 8/16/32 GT/s x 16 lanes x 128/130
encoding (Gen3/Gen4/Gen5: 15.75/31.5/63.0 GB/s; datasheets round this to 16/32/64 GB/s and
quote the sum of both directions, e.g. "PCIe Gen5: 128 GB/s"). Measured pinned copies reach
about 80-85% of it; :data:`PINNED_LINK_EFFICIENCY` takes the low end.

``efficiency`` is an *assumption*, not a datasheet figure: the share of peak FLOP/s a
training step's large kernels reach (cuDNN/cuBLAS typically 50-70% on real layers).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Share of the theoretical PCIe rate that pinned ``cudaMemcpyAsync`` reaches in practice.
PINNED_LINK_EFFICIENCY = 0.80

#: Theoretical bytes/s per direction of an x16 link: GT/s x 16 lanes x 128/130 / 8 bits.
PCIE_X16_BYTES_PER_SECOND = {
    3: 8e9 * 16 * 128 / 130 / 8,
    4: 16e9 * 16 * 128 / 130 / 8,
    5: 32e9 * 16 * 128 / 130 / 8,
}

#: Assumed share of peak FLOP/s reached by training kernels (see the module docstring).
DEFAULT_EFFICIENCY = 0.6

_GIB = 2**30
_T = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: memory, peak throughput, memory bandwidth and host link.

    ``tf32_flops`` is the dense TF32 tensor-core rate (``None`` before Ampere): PyTorch
    runs fp32 convolutions on it by default (``torch.backends.cudnn.allow_tf32`` is true)
    but fp32 matmuls at ``fp32_flops`` (``torch.backends.cuda.matmul.allow_tf32`` is
    false). ``bf16_flops`` / ``fp16_flops`` are dense tensor-core rates with fp32
    accumulation (``None`` where the GPU has no such unit). ``compute_capability`` (NVIDIA's
    "CUDA GPUs" table) decides which fused kernels PyTorch runs on it (flash attention from 8.0).

    Example:
        >>> spec = get_gpu("h100")
        >>> spec.name, round(spec.memory_bytes / 2**30)
        ('H100 SXM 80GB', 80)
        >>> round(spec.host_link_bytes_per_second / 1e9, 1)
        50.4
        >>> round(spec.peak_flops("bf16") / 1e12, 1)
        989.5
    """

    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    fp32_flops: float
    tf32_flops: float | None
    bf16_flops: float | None
    fp16_flops: float | None
    memory_bytes_per_second: float
    pcie_gen: int
    datasheet: str
    compute_capability: tuple[int, int]
    pcie_lanes: int = 16
    efficiency: float = DEFAULT_EFFICIENCY

    @property
    def host_link_bytes_per_second(self) -> float:
        """Practical pinned copy rate per direction (D2H and H2D alike)."""
        lanes_share = self.pcie_lanes / 16
        return PCIE_X16_BYTES_PER_SECOND[self.pcie_gen] * lanes_share * PINNED_LINK_EFFICIENCY

    def peak_flops(self, dtype: str, *, convolution: bool = False) -> float:
        """Peak FLOP/s for a matmul-class kernel in ``dtype`` (``"fp32"``, ``"bf16"``, ``"fp16"``).

        fp32 convolutions use TF32 where the GPU has it (PyTorch's default); a dtype the
        GPU has no tensor unit for falls back to the fp32 rate.

        Example:
            >>> spec = get_gpu("a100-40gb")
            >>> spec.peak_flops("fp32") / 1e12, spec.peak_flops("fp32", convolution=True) / 1e12
            (19.5, 156.0)
        """
        if dtype == "bf16" and self.bf16_flops:
            return self.bf16_flops
        if dtype == "fp16" and self.fp16_flops:
            return self.fp16_flops
        if convolution and self.tf32_flops:
            return self.tf32_flops
        return self.fp32_flops


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet"

GPUS: tuple[GpuSpec, ...] = (
    # H100 SXM5: FP32 67 TF; TF32 989*; BF16/FP16 1,979*; 80GB HBM3 3.35 TB/s; PCIe Gen5 128 GB/s.
    GpuSpec(
        name="H100 SXM 80GB",
        aliases=("h100", "h100-sxm", "h100-sxm5", "h100-80gb"),
        memory_bytes=80 * _GIB,
        fp32_flops=67 * _T,
        tf32_flops=989 / 2 * _T,
        bf16_flops=1979 / 2 * _T,
        fp16_flops=1979 / 2 * _T,
        memory_bytes_per_second=3.35e12,
        pcie_gen=5,
        datasheet=_H100_DS + " (SXM column)",
        compute_capability=(9, 0),
    ),
    # H100 PCIe: FP32 51 TF; TF32 756*; BF16/FP16 1,513*; 80GB HBM2e 2 TB/s; PCIe Gen5 128 GB/s.
    GpuSpec(
        name="H100 PCIe 80GB",
        aliases=("h100-pcie",),
        memory_bytes=80 * _GIB,
        fp32_flops=51 * _T,
        tf32_flops=756 / 2 * _T,
        bf16_flops=1513 / 2 * _T,
        fp16_flops=1513 / 2 * _T,
        memory_bytes_per_second=2.0e12,
        pcie_gen=5,
        datasheet=_H100_DS + " (PCIe column)",
        compute_capability=(9, 0),
    ),
    # H200 SXM: FP32 67 TF; TF32 989*; BF16/FP16 1,979*; 141GB HBM3e 4.8 TB/s; PCIe Gen5 128 GB/s.
    GpuSpec(
        name="H200 SXM 141GB",
        aliases=("h200", "h200-sxm"),
        memory_bytes=141 * _GIB,
        fp32_flops=67 * _T,
        tf32_flops=989 / 2 * _T,
        bf16_flops=1979 / 2 * _T,
        fp16_flops=1979 / 2 * _T,
        memory_bytes_per_second=4.8e12,
        pcie_gen=5,
        datasheet="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)",
        compute_capability=(9, 0),
    ),
    # A100 SXM4 40GB: FP32 19.5 TF; TF32 156 (312*); BF16/FP16 312 (624*); HBM2 1,555 GB/s;
    # PCIe Gen4 64 GB/s.
    GpuSpec(
        name="A100 SXM 40GB",
        aliases=("a100", "a100-40gb", "a100-sxm-40gb"),
        memory_bytes=40 * _GIB,
        fp32_flops=19.5 * _T,
        tf32_flops=156 * _T,
        bf16_flops=312 * _T,
        fp16_flops=312 * _T,
        memory_bytes_per_second=1.555e12,
        pcie_gen=4,
        datasheet=_A100_DS + " (A100 40GB SXM column)",
        compute_capability=(8, 0),
    ),
    # A100 SXM4 80GB: as the 40GB, with HBM2e at 2,039 GB/s.
    GpuSpec(
        name="A100 SXM 80GB",
        aliases=("a100-80gb", "a100-sxm-80gb"),
        memory_bytes=80 * _GIB,
        fp32_flops=19.5 * _T,
        tf32_flops=156 * _T,
        bf16_flops=312 * _T,
        fp16_flops=312 * _T,
        memory_bytes_per_second=2.039e12,
        pcie_gen=4,
        datasheet=_A100_DS + " (A100 80GB SXM column)",
        compute_capability=(8, 0),
    ),
    # L4: FP32 30.3 TF; TF32 120*; BF16/FP16 242*; 24GB GDDR6 300 GB/s; PCIe Gen4 x16 64 GB/s.
    GpuSpec(
        name="L4 24GB",
        aliases=("l4",),
        memory_bytes=24 * _GIB,
        fp32_flops=30.3 * _T,
        tf32_flops=120 / 2 * _T,
        bf16_flops=242 / 2 * _T,
        fp16_flops=242 / 2 * _T,
        memory_bytes_per_second=300e9,
        pcie_gen=4,
        datasheet="NVIDIA L4 Tensor Core GPU datasheet",
        compute_capability=(8, 9),
    ),
    # RTX 4090: FP32 82.6 TF; TF32 82.6 (165.2*); FP16/BF16 with FP32 accumulate 165.2 (330.4*);
    # 24GB GDDR6X 1,008 GB/s; PCIe Gen4 x16.
    GpuSpec(
        name="GeForce RTX 4090 24GB",
        aliases=("rtx4090", "rtx-4090", "4090"),
        memory_bytes=24 * _GIB,
        fp32_flops=82.6 * _T,
        tf32_flops=82.6 * _T,
        bf16_flops=165.2 * _T,
        fp16_flops=165.2 * _T,
        memory_bytes_per_second=1008e9,
        pcie_gen=4,
        datasheet="NVIDIA Ada Lovelace GPU architecture whitepaper, Appendix A (GeForce RTX 4090)",
        compute_capability=(8, 9),
    ),
    # V100 SXM2: FP32 15.7 TF; Tensor (FP16 mixed) 125 TF; no TF32/BF16 units; HBM2 900 GB/s;
    # host link PCIe Gen3 x16 32 GB/s.
    GpuSpec(
        name="V100 SXM2 16GB",
        aliases=("v100", "v100-16gb"),
        memory_bytes=16 * _GIB,
        fp32_flops=15.7 * _T,
        tf32_flops=None,
        bf16_flops=None,
        fp16_flops=125 * _T,
        memory_bytes_per_second=900e9,
        pcie_gen=3,
        datasheet="NVIDIA Tesla V100 GPU datasheet (SXM2 column)",
        compute_capability=(7, 0),
    ),
    GpuSpec(
        name="V100 SXM2 32GB",
        aliases=("v100-32gb",),
        memory_bytes=32 * _GIB,
        fp32_flops=15.7 * _T,
        tf32_flops=None,
        bf16_flops=None,
        fp16_flops=125 * _T,
        memory_bytes_per_second=900e9,
        pcie_gen=3,
        datasheet="NVIDIA Tesla V100 GPU datasheet (SXM2 column)",
        compute_capability=(7, 0),
    ),
)


def _key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def gpu_choices() -> list[str]:
    """Every accepted GPU name, aliases first (what error messages list).

    Example:
        >>> "h100" in gpu_choices() and "l4" in gpu_choices()
        True
    """
    return [alias for spec in GPUS for alias in spec.aliases]


def get_gpu(name: str) -> GpuSpec:
    """Look up a GPU by name or alias, ignoring case, spaces, ``-`` and ``_``.

    Raises ``ValueError`` listing the choices for an unknown name.

    Example:
        >>> get_gpu("H100-SXM").name
        'H100 SXM 80GB'
        >>> get_gpu("a100_80gb").memory_bytes == 80 * 2**30
        True
        >>> get_gpu("tpu")
        Traceback (most recent call last):
        ...
        ValueError: unknown GPU 'tpu'; choose one of: h100, h100-sxm, ...
    """
    wanted = _key(name)
    for spec in GPUS:
        if wanted in {_key(alias) for alias in spec.aliases} or wanted == _key(spec.name):
            return spec
    raise ValueError(f"unknown GPU {name!r}; choose one of: {', '.join(gpu_choices())}")
