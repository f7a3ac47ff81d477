"""The roofline time model: a traced step (kernels, FLOPs, bytes) timed for a GPU's datasheet.

The observation (what a step saves and which kernels it runs) is
:func:`lightning_accudnn.profiling.trace.trace_step`; this module holds what it records,
:class:`StepTrace`, independent of any GPU, and turns it into the planner's
:class:`~lightning_accudnn.profile.StepProfile` for a :class:`~lightning_accudnn.profiling.gpus.GpuSpec`:
each kernel takes the slower of its FLOPs at the GPU's peak rate (times an efficiency) and its
bytes at the memory bandwidth, with no launch overhead and no overlap between kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lightning_accudnn.profile import DEFAULT_MIN_SWAP_BYTES, LayerProfile, SegmentProfile, StepProfile
from lightning_accudnn.profiling.gpus import GpuSpec
from lightning_accudnn.profiling.layer_kinds import layer_kind
from lightning_accudnn.profiling.static_memory import named_state_copies, named_step_temporaries_bytes

__all__ = ["LayerTrace", "OpCost", "StepTrace"]


@dataclass(frozen=True)
class OpCost:
    """One kernel of the traced step.

    ``rate`` names the peak it runs at: ``"fp32"``, ``"bf16"``, ``"fp16"``, or
    ``"fp32-conv"`` (fp32 convolutions run on TF32 tensor cores by default). ``kept`` marks a
    forward kernel whose output selective recomputation keeps (a matrix product, convolution
    or attention kernel: :data:`~lightning_accudnn.profile.SELECTIVE_KEPT_OPS`).

    Example:
        >>> OpCost("0", backward=False, flops=2_000, bytes_moved=48, rate="fp32").flops
        2000
    """

    layer: str
    backward: bool
    flops: int
    bytes_moved: int
    rate: str
    kept: bool = False

    def seconds(self, gpu: GpuSpec) -> float:
        """Roofline time on ``gpu``: the slower of compute and memory traffic.

        Example:
            >>> from lightning_accudnn.profiling.gpus import get_gpu
            >>> op = OpCost("0", backward=False, flops=0, bytes_moved=3_350_000, rate="fp32")
            >>> round(op.seconds(get_gpu("h100")) * 1e6, 3)
            1.0
        """
        dtype, _, kind = self.rate.partition("-")
        peak = gpu.peak_flops(dtype, convolution=kind == "conv") * gpu.efficiency
        return max(self.flops / peak, self.bytes_moved / gpu.memory_bytes_per_second)


@dataclass(frozen=True)
class LayerTrace:
    """What one layer invocation saved and computed.

    ``saved`` lists the byte size of each storage the layer saved for backward (each
    storage once, in the first layer that saved it). ``resaved`` lists, per storage of
    ``saved`` that a later layer saves again, ``(later layer, storage bytes)`` under the
    **last** layer that saves it (or, if that layer saves nothing of its own, the next layer
    that does), as the offload engine lists re-saves (:attr:`.LayerProfile.resaved_by`).
    ``resaved_modules`` lists, per storage of ``resaved`` whose last re-save was by a layer that
    saves nothing of its own, ``(that layer, storage bytes)``
    (:attr:`.LayerProfile.resaved_by_module`). ``float32_bytes`` is the part of ``saved`` in
    float32 storages. ``held`` lists the storages of ``saved`` the step holds throughout (the
    batch), which the engine keeps on the device (a swap would free nothing): not swappable.
    ``forward_working_bytes`` and ``backward_working_bytes`` are what the step
    held beyond the planner's forward and backward levels of the layer
    (:attr:`.LayerProfile.forward_working_bytes`, :mod:`.traced_ledger`).

    Example:
        >>> layer = LayerTrace("conv1", saved=(4_000_000, 512), forward_flops=10, backward_flops=20,
        ...                    resaved=(("conv2", 4_000_000), ("conv2", 512)),
        ...                    resaved_modules=(("relu", 4_000_000),))
        >>> layer.saved_bytes, layer.swappable_bytes(min_swap_bytes=2**20)
        (4000512, 4000000)
        >>> layer.resaved_by(min_swap_bytes=2**20), layer.resaved_by_module(min_swap_bytes=2**20)
        ((('conv2', 4000000),), (('relu', 4000000),))
    """

    name: str
    saved: tuple[int, ...]
    forward_flops: int
    backward_flops: int
    resaved: tuple[tuple[str, int], ...] = ()
    resaved_modules: tuple[tuple[str, int], ...] = ()
    float32_bytes: int = 0
    forward_working_bytes: int = 0
    backward_working_bytes: int = 0
    held: tuple[int, ...] = ()

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved)

    def swappable_bytes(self, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES) -> int:
        """Bytes in storages large enough for the engine to swap, the ones held throughout left out.

        Example:
            >>> LayerTrace("conv1", saved=(4_000_000, 2_000_000), forward_flops=0, backward_flops=0,
            ...            held=(2_000_000,)).swappable_bytes(min_swap_bytes=2**20)
            4000000
        """
        large = sum(size for size in self.saved if size >= min_swap_bytes)
        return large - sum(size for size in self.held if size >= min_swap_bytes)

    def small_storages(self, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES) -> tuple[int, ...]:
        """Sizes of the (non-empty) storages too small for the engine to swap."""
        return tuple(size for size in self.saved if 0 < size < min_swap_bytes)

    def resaved_by(self, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES) -> tuple[tuple[str, int], ...]:
        """The bytes of swappable storages saved again, per later layer
        (:attr:`.LayerProfile.resaved_by`)."""
        return _per_layer(self.resaved, min_swap_bytes)

    def resaved_by_module(self, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES) -> tuple[tuple[str, int], ...]:
        """The part of :meth:`resaved_by` saved again last by a layer that saves nothing of its
        own, per such layer (:attr:`.LayerProfile.resaved_by_module`)."""
        return _per_layer(self.resaved_modules, min_swap_bytes)

    def small_resaved_by(self, min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES) -> tuple[tuple[str, int], ...]:
        """The re-saves of the storages too small for the engine to swap, one per storage
        (:attr:`.LayerProfile.small_resaved_by`)."""
        return tuple((later, size) for later, size in self.resaved if 0 < size < min_swap_bytes)


@dataclass(frozen=True)
class StepTrace:
    """A traced training step, independent of any GPU: turn it into a profile with
    :meth:`to_profile`.

    Layers are in the engine's order: each at its first own save, one that saves nothing at its
    first kernel (a container's own work, such as a residual add, comes after its children's).
    ``segments`` are the module invocations a plan may recompute (see
    :class:`~lightning_accudnn.profile.SegmentProfile`). ``kernels`` lists the kernels the trace
    assumed where the CPU's would save other tensors than the GPU's: ``(op, kernel, calls)``, e.g.
    ``("scaled_dot_product_attention", "flash", 24)``. ``segment_ops`` gives each segment's forward
    kernels as ``(name, first, end)`` indices into ``ops``: what times a segment's selective
    recomputation (its kernels not ``kept``). ``resaves_listed`` says that the layers' ``resaved``
    list every storage saved again by a later layer (a trace of :func:`~.trace.trace_step`): the
    profile then says so too (:attr:`.StepProfile.resaves_listed`). ``working_bytes`` is the most
    the step held at once besides the model's state and its saved activations (outputs nothing
    saves, the loss and its gradient, the activations' gradients in backward:
    :mod:`.working_memory`), and ``allocated_peak_bytes`` the most it held at once, saves included,
    less the model's state as the planner counts it, the parameters' gradients included all step
    (what a device's allocator would count at its peak less the static memory); 0 when not traced.
    The layers' working bytes say where the working memory was held. ``saveless_forward_bytes``
    gives, per saving layer, the most the forward held at once while that layer ran with its saves
    dropped (:mod:`.saveless_forward`; empty when not traced): what a recomputed segment's forward
    holds, which the profile lists as :attr:`.StepProfile.swapped_pass_forward_bytes`.
    ``segment_swappable_inputs`` gives, per segment, the sizes of the input storages the engine
    may swap when it recomputes the segment whole (:meth:`.trace._Segments.swappable_inputs`).

    Example:
        >>> trace = StepTrace(layers=(LayerTrace("a", (8,), 1, 2),), ops=(), param_bytes=40,
        ...                   trainable_param_bytes=40, buffer_bytes=0)
        >>> trace.saved_bytes, trace.static_bytes("sgd-momentum")
        (8, 120)
    """

    layers: tuple[LayerTrace, ...]
    ops: tuple[OpCost, ...]
    param_bytes: int
    trainable_param_bytes: int
    buffer_bytes: int
    dtype: str = "fp32"
    notes: tuple[str, ...] = ()
    segments: tuple[SegmentProfile, ...] = ()
    kernels: tuple[tuple[str, str, int], ...] = ()
    segment_ops: tuple[tuple[str, int, int], ...] = ()
    resaves_listed: bool = False
    working_bytes: int = 0
    allocated_peak_bytes: int = 0
    saveless_forward_bytes: tuple[tuple[str, int], ...] = ()
    segment_swappable_inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def saved_bytes(self) -> int:
        """Every byte saved for backward (deduplicated by storage)."""
        return sum(layer.saved_bytes for layer in self.layers)

    @property
    def float32_saved_bytes(self) -> int:
        """The part of :attr:`saved_bytes` in float32 storages."""
        return sum(layer.float32_bytes for layer in self.layers)

    def float32_saved_by_kind(self) -> tuple[tuple[str, int, int], ...]:
        """Where :attr:`float32_saved_bytes` is, per kind of layer
        (:func:`~.layer_kinds.layer_kind`, the same layer of every block): ``(kind, bytes,
        layers)``, the most bytes first, kinds saving none in float32 left out.

        Example:
            >>> layers = (LayerTrace("h.0.act", (8, 4), 0, 0, float32_bytes=8),
            ...           LayerTrace("h.1.act", (8,), 0, 0, float32_bytes=8), LayerTrace("head", (2,), 0, 0))
            >>> StepTrace(layers, (), 0, 0, 0).float32_saved_by_kind()
            (('h.*.act', 16, 2),)
        """
        kinds: dict[str, list[int]] = {}
        for layer in self.layers:
            if layer.float32_bytes:
                kind = kinds.setdefault(layer_kind(layer.name), [0, 0])
                kind[0] += layer.float32_bytes
                kind[1] += 1
        ranked = sorted(kinds.items(), key=lambda item: -item[1][0])
        return tuple((kind, nbytes, layers) for kind, (nbytes, layers) in ranked)

    @property
    def forward_flops(self) -> int:
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def backward_flops(self) -> int:
        return sum(layer.backward_flops for layer in self.layers)

    def static_bytes(self, optimizer: str = "adam") -> int:
        """Parameters, gradients, optimizer state and buffers.

        ``optimizer`` is one of :data:`~lightning_accudnn.profiling.static_memory.NAMED_OPTIMIZERS`
        (``"adam"``/``"adamw"``: two moments per trainable parameter, ``"sgd"``: none,
        ``"sgd-momentum"``: one buffer, ``"none"``), sized by the one optimizer-state model.

        Example:
            >>> trace = StepTrace((), (), param_bytes=100, trainable_param_bytes=100, buffer_bytes=4)
            >>> trace.static_bytes("adam")
            404
        """
        state = named_state_copies(optimizer) * self.trainable_param_bytes
        return self.param_bytes + self.trainable_param_bytes + state + self.buffer_bytes

    def layer_seconds(self, gpu: GpuSpec) -> dict[str, tuple[float, float]]:
        """Forward and backward seconds per layer on ``gpu`` (sum of kernel rooflines).

        Example:
            >>> from lightning_accudnn.profiling.gpus import get_gpu
            >>> ops = (OpCost("a", False, 0, 3_350_000, "fp32"), OpCost("a", True, 0, 6_700_000, "fp32"))
            >>> trace = StepTrace((LayerTrace("a", (), 0, 0),), ops, 0, 0, 0)
            >>> forward, backward = trace.layer_seconds(get_gpu("h100"))["a"]
            >>> round(forward * 1e6, 3), round(backward * 1e6, 3)
            (1.0, 2.0)
        """
        seconds = {layer.name: [0.0, 0.0] for layer in self.layers}
        for op in self.ops:
            seconds.setdefault(op.layer, [0.0, 0.0])[int(op.backward)] += op.seconds(gpu)
        return {name: (fwd, bwd) for name, (fwd, bwd) in seconds.items()}

    def to_profile(
        self,
        gpu: GpuSpec,
        optimizer: str = "adam",
        min_swap_bytes: int = DEFAULT_MIN_SWAP_BYTES,
    ) -> StepProfile:
        """The :class:`StepProfile` the planner consumes, timed for ``gpu``.

        Host link bandwidths (both directions) are the GPU's practical pinned PCIe rate. Between
        the passes the step holds what ``optimizer``'s multi-tensor step holds beside its state
        (:func:`~lightning_accudnn.profiling.static_memory.named_step_temporaries_bytes`).

        Example:
            >>> from lightning_accudnn.profiling.gpus import get_gpu
            >>> trace = StepTrace((LayerTrace("a", (2**21, 10), 0, 0),), (), 0, 0, 0)
            >>> layer = trace.to_profile(get_gpu("l4"), optimizer="none").layers[0]
            >>> layer.saved_bytes, layer.swappable_bytes
            (2097162, 2097152)
        """
        seconds = self.layer_seconds(gpu)
        layers = tuple(
            LayerProfile(
                name=layer.name,
                saved_bytes=layer.saved_bytes,
                swappable_bytes=layer.swappable_bytes(min_swap_bytes),
                forward_seconds=seconds[layer.name][0],
                backward_seconds=seconds[layer.name][1],
                small_storages=layer.small_storages(min_swap_bytes),
                resaved_by=layer.resaved_by(min_swap_bytes),
                small_resaved_by=layer.small_resaved_by(min_swap_bytes),
                resaved_by_module=layer.resaved_by_module(min_swap_bytes),
                forward_working_bytes=layer.forward_working_bytes,
                backward_working_bytes=layer.backward_working_bytes,
            )
            for layer in self.layers
        )
        link = gpu.host_link_bytes_per_second
        return StepProfile(
            layers=layers,
            static_bytes=self.static_bytes(optimizer),
            d2h_bytes_per_second=link,
            h2d_bytes_per_second=link,
            segments=self._with_swappable_inputs(self.timed_segments(gpu), min_swap_bytes),
            resaves_listed=self.resaves_listed,
            outside_working_bytes=named_step_temporaries_bytes(optimizer, self.trainable_param_bytes),
            swapped_pass_forward_bytes=self.saveless_forward_bytes,
        )

    def _with_swappable_inputs(
        self, segments: tuple[SegmentProfile, ...], min_swap_bytes: int
    ) -> tuple[SegmentProfile, ...]:
        """``segments`` with the bytes and storages of their inputs the engine may swap
        (:attr:`segment_swappable_inputs` of at least ``min_swap_bytes``)."""
        swappable = {
            name: [size for size in sizes if size > 0 and size >= min_swap_bytes]
            for name, sizes in self.segment_swappable_inputs
        }
        result = []
        for segment in segments:
            sizes = swappable.get(segment.name)
            if sizes:
                nbytes = min(sum(sizes), segment.input_bytes)
                segment = replace(segment, swappable_input_bytes=nbytes, swappable_input_storages=len(sizes))
            result.append(segment)
        return tuple(result)

    def timed_segments(self, gpu: GpuSpec) -> tuple[SegmentProfile, ...]:
        """The segments, each measured for selective recomputation with the share of its forward
        kernels' time on ``gpu`` that selective recomputation runs again.

        Example:
            >>> from lightning_accudnn.profiling.gpus import get_gpu
            >>> ops = (OpCost("b", False, 0, 3_350_000, "fp32", kept=True),
            ...        OpCost("b", False, 0, 1_117_000, "fp32"))
            >>> segment = SegmentProfile("b", 0, selective_kept_bytes=8)
            >>> trace = StepTrace((), ops, 0, 0, 0, segments=(segment,), segment_ops=(("b", 0, 2),))
            >>> round(trace.timed_segments(get_gpu("h100"))[0].selective_recompute_share, 2)
            0.25
        """
        ranges = {name: (first, end) for name, first, end in self.segment_ops}
        timed = []
        for segment in self.segments:
            span = ranges.get(segment.name)
            if segment.selective_kept_bytes is not None and span is not None:
                recomputed = total = 0.0
                for op in self.ops[span[0] : span[1]]:
                    if op.backward:
                        continue
                    seconds = op.seconds(gpu)
                    total += seconds
                    recomputed += 0.0 if op.kept else seconds
                share = min(1.0, recomputed / total) if total > 0 else 1.0
                segment = replace(segment, selective_recompute_share=share)
            timed.append(segment)
        return tuple(timed)


def _per_layer(storages: tuple[tuple[str, int], ...], min_swap_bytes: int) -> tuple[tuple[str, int], ...]:
    """The bytes of the swappable storages of ``(layer, storage bytes)`` pairs, per layer."""
    per_layer: dict[str, int] = {}
    for name, size in storages:
        if size > 0 and size >= min_swap_bytes:
            per_layer[name] = per_layer.get(name, 0) + size
    return tuple(per_layer.items())
