"""The dry-run trace against the device: what one training step saves for backward, traced as
``accudnn plan`` traces it and measured for real, layer by layer.

    python -m bench.trace_check --case gpt2-medium-bf16         # a trace, then two training steps
    python -m bench.trace_check --case resnet152-bf16
    python -m bench.trace_check --case tiny --device cpu --batch-size 2   # CI, seconds
    python -m bench.trace_check --case tiny --device cpu --dtype fp32 --gpu none

For one case of ``bench.planner`` (:data:`bench.planner.cases.CASES`):

1. **traced**: the step traced under fake tensors for a GPU, as the CLI traces it
   (:func:`bench.planner.cases.trace_case`): the GPU the step runs on (its name matched to the
   planner's specs, :func:`gpu_for_device`), or ``--gpu NAME``; on a CPU an H100 unless
   ``--gpu none`` (the CPU's kernels). Per layer the bytes it saves (``LayerTrace.saved_bytes``).
2. **measured**: the same model built for real on the device (``--device``: CUDA when there is
   one), a batch of zeros of the case's shape and dtype, the case's precision (``bf16``:
   ``torch.autocast`` to bfloat16 with fp32 parameters, as Lightning's ``"bf16-mixed"``), the
   trace's loss (the mean of every floating-point output that requires grad), after one warm-up
   step. The forward runs under ``saved_tensors_hooks`` that count each saved storage once (by
   ``untyped_storage().data_ptr()``), skipping the storages of parameters and buffers, under the
   layer running (``LayerTracker``, so the names are the trace's): the trace's rule, on real
   tensors and the device's own kernels. On CUDA also ``torch.cuda.memory_allocated()`` after the
   forward (the outputs dropped, the loss kept) less before it, and
   ``torch.cuda.max_memory_allocated()`` over forward and backward.

The report lists, per kind of layer (the names with their first index, the block's, replaced by
``*``: ``transformer.h.*.mlp.act``), the traced and measured bytes and their ratio, then the
totals; the JSON also has, per layer, the size of each storage either saw and the dtype of each
measured one. ``--batch-size`` and ``--dtype`` run the case at another batch or precision. On
a CPU the measurement runs the CPU's kernels: against a trace for a GPU it differs by design
where the GPU's kernels save other tensors (attention, dropout, CUDA autocast's float32 ops);
against a trace with ``--gpu none`` it agrees layer by layer, except that the trace always takes
CUDA's fused dropout (a ``bool`` mask where the CPU keeps one in the activation's dtype).

Writes ``<results-dir>/<device>/<date>-trace-check-<case>.json`` and ``.md``.

Example:
    >>> layer_kind("transformer.h.11.mlp.act"), layer_kind("layer1.0.relu#2")
    ('transformer.h.*.mlp.act', 'layer1.*.relu#2')
    >>> gpu_for_device("NVIDIA H100 80GB HBM3").name
    'H100 SXM 80GB'
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.environment import REPO_ROOT, device_name, resolve_device
from bench.planner.cases import CASES, Case, trace_case
from bench.report import fmt_bytes, fmt_ratio, write_result
from lightning_accudnn.cli import INPUT_DTYPES, resolve_model
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.gpus import GPUS, GpuSpec, get_gpu
from lightning_accudnn.profiling.layer_kinds import layer_kind
from lightning_accudnn.profiling.roofline import StepTrace
from lightning_accudnn.profiling.trace import DTYPES, precision, step_loss, trace_step

__all__ = [
    "RECORD_FIELDS",
    "MeasuredStep",
    "check",
    "compare",
    "gpu_for_device",
    "layer_kind",
    "main",
    "markdown",
    "measure_step",
]

#: The GPU a step is traced for on a CPU when ``--gpu`` is not given.
CPU_DEFAULT_GPU = "h100"
#: The fields of a result (the JSON adds ``environment``).
RECORD_FIELDS = (
    "kind",
    "label",
    "case",
    "title",
    "model",
    "batch_size",
    "input_shape",
    "input_dtype",
    "dtype",
    "device",
    "gpu",
    "assumed_kernels",
    "trace_seconds",
    "traced_bytes",
    "measured_bytes",
    "ratio",
    "forward_allocated_bytes",
    "baseline_allocated_bytes",
    "peak_allocated_bytes",
    "kinds",
    "layers",
)
CPU_LABEL = (
    "CPU run: measured with the CPU's kernels, not a GPU's. Where the GPU traced for runs other "
    "kernels (attention, dropout, CUDA autocast's float32 ops) the two differ by design; these "
    "figures show that the check works, not what a GPU saves."
)


def gpu_for_device(name: str, memory_bytes: int | None = None) -> GpuSpec:
    """The planner's spec of the GPU ``torch.cuda.get_device_name`` calls ``name``: of the specs
    whose model (``h100``, ``a100``, ``4090``...) is a word of ``name``, the closest in memory to
    ``memory_bytes`` (when given), then the one sharing most words with ``name``, then the one
    with the longest alias found in it. Raises ``ValueError`` for a GPU the planner does not know.

    Example:
        >>> gpu_for_device("NVIDIA H100 PCIe").name
        'H100 PCIe 80GB'
        >>> gpu_for_device("NVIDIA A100-SXM4-80GB").name
        'A100 SXM 80GB'
        >>> gpu_for_device("Tesla V100-SXM2-32GB", memory_bytes=34_000_000_000).name
        'V100 SXM2 32GB'
        >>> gpu_for_device("NVIDIA L40S")
        Traceback (most recent call last):
        ...
        ValueError: the planner knows no spec for the GPU 'NVIDIA L40S'; pass --gpu NAME (h100, ...)
    """
    words = set(_words(name))
    key = _key(name)
    ranked = []
    for spec in GPUS:
        spec_words = _words(spec.name)
        model = next((word for word in spec_words if any(ch.isdigit() for ch in word)), None)
        if model not in words:
            continue
        distance = 0 if memory_bytes is None else abs(spec.memory_bytes - memory_bytes)
        alias = max((len(_key(alias)) for alias in spec.aliases if _key(alias) in key), default=0)
        ranked.append((distance, -len(words.intersection(spec_words)), -alias, spec))
    if not ranked:
        choices = ", ".join(alias for spec in GPUS for alias in spec.aliases)
        raise ValueError(f"the planner knows no spec for the GPU {name!r}; pass --gpu NAME ({choices})")
    return min(ranked, key=lambda entry: entry[:3])[3]


def _words(text: str) -> list[str]:
    return [word for word in re.split(r"[^a-z0-9]+", text.lower()) if word]


def _key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def resolve_gpu(option: str, device: torch.device) -> GpuSpec | None:
    """``--gpu``: ``auto`` (the GPU of a CUDA ``device``, else an H100), ``none`` (the CPU's
    kernels) or a GPU name.

    Example:
        >>> resolve_gpu("auto", torch.device("cpu")).name, resolve_gpu("none", torch.device("cpu"))
        ('H100 SXM 80GB', None)
    """
    if option == "none":
        return None
    if option != "auto":
        return get_gpu(option)
    if device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory
        return gpu_for_device(torch.cuda.get_device_name(device), memory)
    return get_gpu(CPU_DEFAULT_GPU)


@dataclass
class MeasuredStep:
    """What one real training step saved for backward, per layer (in the order layers first
    saved), and on CUDA what the allocator held.

    ``saved`` lists, per layer, the byte size of each storage it saved first; ``dtypes`` the
    dtype of the tensor that saved it. ``forward_allocated_bytes``: allocated after the forward
    and loss (outputs dropped) less before; ``peak_allocated_bytes``: the allocator's peak over
    forward and backward; ``baseline_allocated_bytes``: allocated before the forward (weights,
    batch). ``None`` off CUDA.

    Example:
        >>> step = MeasuredStep(saved={"fc": [4096, 16]}, dtypes={"fc": ["float32", "bool"]})
        >>> step.saved_bytes, step.layer_bytes("fc"), step.layer_bytes("other")
        (4112, 4112, 0)
    """

    saved: dict[str, list[int]] = field(default_factory=dict)
    dtypes: dict[str, list[str]] = field(default_factory=dict)
    forward_allocated_bytes: int | None = None
    baseline_allocated_bytes: int | None = None
    peak_allocated_bytes: int | None = None

    @property
    def saved_bytes(self) -> int:
        return sum(sum(sizes) for sizes in self.saved.values())

    def layer_bytes(self, name: str) -> int:
        return sum(self.saved.get(name, ()))


@dataclass
class _SaveCounter:
    """``saved_tensors_hooks`` that count each saved storage once, under the layer running."""

    tracker: LayerTracker
    skipped: set[int]
    step: MeasuredStep
    seen: dict[int, torch.Tensor] = field(default_factory=dict)  # held: addresses stay unique

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no single storage
            self._count(tensor.numel() * tensor.element_size(), tensor)
            return tensor
        address = storage.data_ptr()
        if address in self.skipped or (address in self.seen and storage.nbytes() > 0):
            return tensor
        self.seen[address] = tensor
        self._count(storage.nbytes(), tensor)
        return tensor

    def _count(self, nbytes: int, tensor: torch.Tensor) -> None:
        layer = self.tracker.current
        self.step.saved.setdefault(layer, []).append(nbytes)
        self.step.dtypes.setdefault(layer, []).append(str(tensor.dtype).removeprefix("torch."))


def measure_step(
    build: Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    *,
    device: torch.device,
    input_dtype: torch.dtype = torch.float32,
    dtype: str = "fp32",
) -> MeasuredStep:
    """Run one training step of ``build()`` on ``device`` (after one warm-up step) and count what
    its forward saves, as :func:`~lightning_accudnn.profiling.trace.trace_step` counts it.

    Arguments as ``trace_step``'s: ``input_shape`` includes the batch dimension, the batch is
    zeros of ``input_dtype``, ``dtype`` is ``"fp32"``, mixed ``"bf16"``/``"fp16"`` (autocast,
    fp32 parameters) or ``"bf16-true"``/``"fp16-true"`` (the model and a floating-point batch
    in that dtype).

    Example:
        >>> build = lambda: nn.Sequential(nn.Linear(512, 512), nn.ReLU())
        >>> step = measure_step(build, (1024, 512), device=torch.device("cpu"))
        >>> step.saved, step.dtypes["1"], step.peak_allocated_bytes
        ({'0': [2097152], '1': [2097152]}, ['float32'], None)
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    torch.manual_seed(0)
    with torch.device(device):
        model = build()
    true_dtype = DTYPES[dtype] if dtype.endswith("-true") else None
    if true_dtype is not None:
        model.to(true_dtype)
        if input_dtype.is_floating_point:
            input_dtype = true_dtype
    model.train()
    batch = torch.zeros(input_shape, dtype=input_dtype, device=device)
    with precision(dtype, device.type):  # warm-up: workspaces and lazy state, outside the figures
        warm_up = step_loss(model(batch))
    warm_up.backward()
    del warm_up
    model.zero_grad(set_to_none=True)
    step = MeasuredStep()
    skipped = {tensor.untyped_storage().data_ptr() for tensor in (*model.parameters(), *model.buffers())}
    skipped.discard(0)  # an empty parameter's address: no saved tensor is skipped for sharing it
    counter = _SaveCounter(LayerTracker(), skipped, step)
    with _allocator(device, step):
        with (
            counter.tracker.attached(model),
            torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda tensor: tensor),
            precision(dtype, device.type),
        ):
            output = model(batch)
            loss = step_loss(output)
        del output
        counter.seen.clear()  # the graph holds what it saved; nothing more is kept
        _forward_done(device, step)
        loss.backward()
    return step


@contextlib.contextmanager
def _allocator(device: torch.device, step: MeasuredStep) -> Iterator[None]:
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step.baseline_allocated_bytes = torch.cuda.memory_allocated(device)
    yield
    torch.cuda.synchronize(device)
    step.peak_allocated_bytes = torch.cuda.max_memory_allocated(device)


def _forward_done(device: torch.device, step: MeasuredStep) -> None:
    if device.type == "cuda" and step.baseline_allocated_bytes is not None:
        torch.cuda.synchronize(device)
        step.forward_allocated_bytes = torch.cuda.memory_allocated(device) - step.baseline_allocated_bytes


def compare(trace: StepTrace, measured: MeasuredStep) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per kind of layer (:func:`layer_kind`, in the trace's order, then kinds only measured) and
    per layer: the traced and measured bytes, and the storages each saw.

    Example:
        >>> from lightning_accudnn.profiling.roofline import LayerTrace
        >>> layers = (LayerTrace("h.0.act", (8, 4), 0, 0), LayerTrace("h.1.act", (8,), 0, 0))
        >>> trace = StepTrace(layers, (), 0, 0, 0)
        >>> kinds, layers = compare(trace, MeasuredStep(saved={"h.0.act": [8], "h.1.act": [16]}))
        >>> kinds
        [{'kind': 'h.*.act', 'layers': 2, 'traced_bytes': 20, 'measured_bytes': 24, 'ratio': 1.2}]
        >>> layers[0]["traced_storages"], layers[0]["measured_storages"]
        ([8, 4], [8])
    """
    traced = {layer.name: list(layer.saved) for layer in trace.layers}
    names = list(traced) + [name for name in measured.saved if name not in traced]
    layers: list[dict[str, Any]] = [
        {
            "name": name,
            "traced_bytes": sum(traced.get(name, ())),
            "measured_bytes": measured.layer_bytes(name),
            "traced_storages": traced.get(name, []),
            "measured_storages": measured.saved.get(name, []),
            "measured_dtypes": measured.dtypes.get(name, []),
        }
        for name in names
    ]
    kinds: dict[str, dict[str, Any]] = {}
    for layer in layers:
        kind = kinds.setdefault(
            layer_kind(layer["name"]),
            {"kind": layer_kind(layer["name"]), "layers": 0, "traced_bytes": 0, "measured_bytes": 0},
        )
        kind["layers"] += 1
        kind["traced_bytes"] += layer["traced_bytes"]
        kind["measured_bytes"] += layer["measured_bytes"]
    for kind in kinds.values():
        kind["ratio"] = _ratio(kind["measured_bytes"], kind["traced_bytes"])
    return list(kinds.values()), layers


def _ratio(measured: int, traced: int) -> float | None:
    return measured / traced if traced else None


def _trace(case: Case, gpu: GpuSpec | None) -> tuple[StepTrace, dict[str, dict[str, int]], float]:
    if gpu is not None:
        traced = trace_case(case, gpu)
        return traced.trace, traced.kernels, traced.trace_seconds
    started = time.perf_counter()
    trace = trace_step(
        resolve_model(case.model).builder(case.input_shape),
        (case.batch_size, *case.input_shape),
        tracker=LayerTracker(),
        input_dtype=INPUT_DTYPES[case.input_dtype],
        dtype=case.dtype,
    )
    return trace, {}, time.perf_counter() - started


def check(case: Case, gpu: GpuSpec | None, device: torch.device) -> dict[str, Any]:
    """Trace ``case`` for ``gpu`` (``None``: the CPU's kernels), measure it on ``device``, compare.

    Example:
        >>> import dataclasses
        >>> small = dataclasses.replace(CASES["tiny"], batch_size=2, input_shape=(64,), dtype="fp32")
        >>> record = check(small, None, torch.device("cpu"))
        >>> record["device"], record["gpu"], record["traced_bytes"] > 0, record["measured_bytes"] > 0
        ('cpu', None, True, True)
    """
    trace, kernels, seconds = _trace(case, gpu)
    measured = measure_step(
        resolve_model(case.model).builder(case.input_shape),
        (case.batch_size, *case.input_shape),
        device=device,
        input_dtype=INPUT_DTYPES[case.input_dtype],
        dtype=case.dtype,
    )
    kinds, layers = compare(trace, measured)
    record = {
        "kind": "trace-check",
        "label": CPU_LABEL if device.type == "cpu" else None,
        "case": case.key,
        "title": case.title,
        "model": case.model,
        "batch_size": case.batch_size,
        "input_shape": list(case.input_shape),
        "input_dtype": case.input_dtype,
        "dtype": case.dtype,
        "device": device_name(device),
        "gpu": None if gpu is None else gpu.name,
        "assumed_kernels": kernels,
        "trace_seconds": seconds,
        "traced_bytes": trace.saved_bytes,
        "measured_bytes": measured.saved_bytes,
        "ratio": _ratio(measured.saved_bytes, trace.saved_bytes),
        "forward_allocated_bytes": measured.forward_allocated_bytes,
        "baseline_allocated_bytes": measured.baseline_allocated_bytes,
        "peak_allocated_bytes": measured.peak_allocated_bytes,
        "kinds": kinds,
        "layers": layers,
    }
    return record


def markdown(record: dict[str, Any]) -> str:
    """The kinds of layers side by side, then the totals and the allocator's figures."""
    traced_for = record["gpu"] or "the CPU's kernels"
    lines = [
        f"# Trace check: {record['title']}, traced for {traced_for}, measured on {record['device']}",
        "",
    ]
    if record["label"]:
        lines += [f"**{record['label']}**", ""]
    kernels = "; ".join(
        f"{op}: " + ", ".join(f"{kernel} x{calls}" for kernel, calls in choices.items())
        for op, choices in record["assumed_kernels"].items()
    )
    lines += [
        f"- case `{record['case']}` ({record['model']}, batch {record['batch_size']} x "
        f"{tuple(record['input_shape'])} {record['input_dtype']}, {record['dtype']}); traced in "
        f"{record['trace_seconds']:.1f} s" + (f"; kernels assumed: {kernels}" if kernels else ""),
        f"- saved for backward: traced {fmt_bytes(record['traced_bytes'])}, measured "
        f"{fmt_bytes(record['measured_bytes'])} (measured / traced {fmt_ratio(record['ratio'], 3)})",
    ]
    if record["forward_allocated_bytes"] is not None:
        baseline = record["baseline_allocated_bytes"]
        lines.append(
            f"- CUDA allocator: {fmt_bytes(record['forward_allocated_bytes'])} more allocated after the "
            f"forward and loss (outputs dropped) than before; peak over forward and backward "
            f"{fmt_bytes(record['peak_allocated_bytes'])}, {fmt_bytes(baseline)} of it allocated before "
            "the forward (weights, batch)"
        )
    lines += [
        "",
        "| layers | calls | traced | measured | measured / traced |",
        "|---|---|---|---|---|",
    ]
    for kind in record["kinds"]:
        if kind["traced_bytes"] == 0 and kind["measured_bytes"] == 0:
            continue
        lines.append(
            f"| `{kind['kind']}` | {kind['layers']} | {fmt_bytes(kind['traced_bytes'])} "
            f"| {fmt_bytes(kind['measured_bytes'])} | {fmt_ratio(kind['ratio'], 3)} |"
        )
    lines.append(
        f"| total | | {fmt_bytes(record['traced_bytes'])} | {fmt_bytes(record['measured_bytes'])} "
        f"| {fmt_ratio(record['ratio'], 3)} |"
    )
    return "\n".join(lines) + "\n"


def _changed(case: Case, dtype: str | None, batch_size: int | None) -> Case:
    """``case`` at another precision or batch size, its title saying so.

    Example:
        >>> _changed(CASES["tiny"], "fp32", 2).title
        'tiny transformer (tests), 128 x 512 tokens, bf16; run at batch 2, fp32'
    """
    changes = [f"batch {batch_size}"] if batch_size is not None else []
    changes += [dtype] if dtype is not None else []
    if not changes:
        return case
    return dataclasses.replace(
        case,
        dtype=dtype or case.dtype,
        batch_size=batch_size or case.batch_size,
        title=f"{case.title}; run at {', '.join(changes)}",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.trace_check", description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="gpt2-medium-bf16")
    parser.add_argument("--device", default="auto", help="auto (CUDA when there is one), cpu, cuda, cuda:N")
    parser.add_argument(
        "--gpu",
        default="auto",
        help="the GPU traced for: auto (the device's, an H100 on a CPU), none (the CPU's kernels) or a name",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="another precision than the case's")
    parser.add_argument("--batch-size", type=int, help="another batch size than the case's")
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of ``python -m bench.trace_check``; returns the record it wrote."""
    args = build_parser().parse_args(argv)
    device = resolve_device(args.device)
    case = _changed(CASES[args.case], args.dtype, args.batch_size)
    record = check(case, resolve_gpu(args.gpu, device), device)
    text = markdown(record)
    write_result(args.results_dir, device, f"trace-check-{case.key}", record, text)
    print(text)
    return record


if __name__ == "__main__":
    main()
