"""The profile vocabulary every room shares: what one training step saved, layer by layer.

A profile is plain data. The offload engine (``ops``) reports its measurements in these
records, the ``accudnn plan`` command fills them from a FakeTensor trace, tests write them
by hand, and the planner turns them into plans. This module imports nothing but the
standard library, so both ``ops`` and ``planner`` may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

#: The layer that owns work done outside every submodule (the loss in ``training_step``).
ROOT_LAYER = "(root)"

#: Saved tensors smaller than this stay on the device (copying them costs more than it frees).
DEFAULT_MIN_SWAP_BYTES = 2**20

#: The ATen ops (overload packet names) whose outputs a selectively recomputed segment keeps:
#: matrix products, convolutions and attention kernels, the expensive work. Every other op
#: (normalisation, activations, dropout, residual adds...) is run again in backward.
SELECTIVE_KEPT_OPS: frozenset[str] = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "_int_mm",
        "_scaled_mm",
        "convolution",
        "_convolution",
        "cudnn_convolution",
        "mkldnn_convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    }
)


class LayerChoice(str, Enum):
    """What a plan does with the activations a layer saves for backward.

    ``KEEP`` leaves them on the device, ``SWAP`` copies them to host memory in forward and
    back in backward, ``RECOMPUTE`` saves only the layer's inputs and runs the layer again
    in backward. The values are the words the plan table and ``--json`` use.

    Example:
        >>> LayerChoice("swap") is LayerChoice.SWAP, LayerChoice.RECOMPUTE.value
        (True, 'recompute')
    """

    KEEP = "keep"
    SWAP = "swap"
    RECOMPUTE = "recompute"


def resave_position(layer: str, saving: dict[str, Any]) -> tuple[int, bool]:
    """Where a pass records a re-save by ``layer`` (:attr:`LayerProfile.resaved_by`):
    ``(index, noted)``, the index among ``saving`` (the layers that saved something of their
    own so far, in order) of the layer from whose backward on the bytes are needed, and whether
    ``layer`` is noted as the module that saved them again (:attr:`LayerProfile.resaved_by_module`).

    At ``layer`` itself when it is the latest of them; else (it saves nothing of its own, or its
    own code saves again after a submodule that saved since) at the next layer to save, whose
    backward starts earlier (the safe side), ``layer`` noted: a recomputed segment holds the
    re-save only if it holds ``layer``.

    Example:
        >>> saving = {"body": None, "body.act": None}
        >>> resave_position("body.act", saving), resave_position("body", saving)
        ((1, False), (2, True))
    """
    if saving and next(reversed(saving)) == layer:
        return len(saving) - 1, False
    return len(saving), True


def most_bytes_by_name(*listed: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """Per name, the most bytes the lists give it (sorted by name): bytes listed by layer, such
    as :attr:`LayerProfile.retired_alive_from`, from several measurements at once.

    Example:
        >>> most_bytes_by_name((("x", 5), ("y", 1)), (("y", 3),))
        (('x', 5), ('y', 3))
    """
    most = dict(listed[0]) if listed else {}
    for later in listed[1:]:
        for name, nbytes in later:
            if nbytes > most.get(name, 0):
                most[name] = nbytes
    return tuple(sorted(most.items()))


@dataclass(frozen=True)
class LayerProfile:
    """One layer invocation, in forward order.

    ``saved_bytes`` counts every activation the layer saves for backward (deduplicated by
    storage); ``swappable_bytes`` is the part the engine may move to the host (the rest is
    too small or opted out and always stays on the device). ``small_storages`` lists the
    sizes of the storages that stay only because they are below ``min_swap_bytes`` (empty
    when unknown), so that the planner can say what a smaller threshold would save.

    ``resaved_by`` lists, as ``(later layer, bytes)``, the part of ``swappable_bytes`` in
    storages that a later layer saves again (a ResNet block's input, saved by the previous
    block's last ReLU and again by the next block's first convolution and downsample), each
    under the **last** layer that saves it. The engine brings a storage back in reverse order
    of its last save, so in backward those bytes are on the device from the start of that
    later layer's backward until this layer's backward ends; the planner counts them so
    (see :mod:`lightning_accudnn.planner.timeline`). The later layer must be in the profile
    (with 0 saved bytes if it saved nothing new); an entry naming this layer has no effect.
    ``small_resaved_by`` lists the same, one entry per storage, for the storages of
    ``small_storages`` (empty when unknown): the re-saves that a smaller ``min_swap_bytes``
    would list (:meth:`StepProfile.with_min_swap_bytes`). A layer that saves a storage again but
    nothing of its own (a convolution saving the output of the ReLU before it) is not a layer of a
    measured profile, and ``resaved_by`` lists its re-saves under the next layer that saves
    something; ``resaved_by_module`` lists those bytes (a part of ``resaved_by``'s; bytes beyond
    them count for nothing) under the module that saved them again (empty when unknown), so that
    recomputation accounting can tell a re-save inside a segment from one after it.

    ``forward_working_bytes`` and ``backward_working_bytes`` are the *working memory* the ledger
    never sees (outputs nothing saves yet, a loss's float32 logits and their gradients,
    activations' gradients, kernel workspaces): what the step holds at most beyond the planner's
    forward level of this layer (at the start of its forward, counting its saves at once) while
    its forward runs, and beyond its backward level (counting its bytes held until its backward
    ends) while its backward runs. 0 when not measured (see
    :mod:`lightning_accudnn.planner.timeline`); negative when the step holds less than the level
    counts then (model state counted all step but not allocated yet, such as the parameters'
    gradients before a backward that makes them). Both are as a plan that keeps every layer would
    see them: ``retired_alive_bytes`` is, at this layer's forward level, the most bytes of
    storages swapped before it whose copy was out and which the model's code still held (a
    residual block's input until the addition), which a plan that swaps holds beyond its level.
    ``retired_alive_from`` lists, by the layer that saved them first, the most of those bytes
    each layer's storages were (empty: not known); a plan adds no more than the share of the
    layers it swaps, when the list covers ``retired_alive_bytes``.

    ``swappable_storages`` is how many copies out swapping the layer takes: its swappable
    records, one per storage or per part of one that a view lineage saved (0 when unknown). A
    plan charges each the host's time per swapped storage
    (:attr:`StepProfile.swap_host_seconds`).

    ``backward_static_not_held_bytes`` is, of the step's static memory, the most the device did
    not hold where ``backward_working_bytes`` was measured (the gradients the backward had not
    made yet, autocast's weight copies, gone with the forward), which that figure is net of
    (:attr:`StepProfile.static_not_held_bytes`); ``None``: the step's figure.

    ``weight_copy_bytes`` are autocast's low-precision copies of parameters this layer saves,
    counted in the model state, not in its saves: a plan that recomputes the layer holds them
    until the forward ends (autocast's cache) and again while its recomputation and backward run
    (0 when unknown, or when the step's backward may run while the cache holds them).

    Example:
        >>> LayerProfile("layer1.0.conv1", saved_bytes=4_000_000, swappable_bytes=4_000_000)
        LayerProfile(name='layer1.0.conv1', saved_bytes=4000000, swappable_bytes=4000000, \
forward_seconds=0.0, backward_seconds=0.0)
    """

    name: str
    saved_bytes: int
    swappable_bytes: int
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    small_storages: tuple[int, ...] = field(default=(), repr=False)
    resaved_by: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    small_resaved_by: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    resaved_by_module: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    forward_working_bytes: int = field(default=0, repr=False)
    backward_working_bytes: int = field(default=0, repr=False)
    retired_alive_bytes: int = field(default=0, repr=False)
    weight_copy_bytes: int = field(default=0, repr=False)
    retired_alive_from: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    swappable_storages: int = field(default=0, repr=False)
    backward_static_not_held_bytes: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.retired_alive_bytes < 0 or self.weight_copy_bytes < 0 or self.swappable_storages < 0:
            raise ValueError(
                f"layer {self.name!r}: retired_alive_bytes, weight_copy_bytes and swappable_storages "
                f"must be >= 0, got {self.retired_alive_bytes}, {self.weight_copy_bytes}, "
                f"{self.swappable_storages}"
            )
        if not 0 <= self.swappable_bytes <= self.saved_bytes:
            raise ValueError(
                f"layer {self.name!r}: swappable_bytes ({self.swappable_bytes}) must lie in "
                f"[0, saved_bytes={self.saved_bytes}]"
            )
        if any(size <= 0 for size in self.small_storages) or sum(self.small_storages) > self.resident_bytes:
            raise ValueError(
                f"layer {self.name!r}: small_storages must be positive sizes summing to at most "
                f"the resident bytes ({self.resident_bytes}), got {self.small_storages}"
            )
        resaved = [nbytes for _, nbytes in self.resaved_by]
        if any(nbytes <= 0 for nbytes in resaved) or sum(resaved) > self.swappable_bytes:
            raise ValueError(
                f"layer {self.name!r}: resaved_by must hold positive byte counts summing to at most "
                f"swappable_bytes ({self.swappable_bytes}), got {self.resaved_by}"
            )
        if any(nbytes <= 0 for _, nbytes in self.resaved_by_module):
            raise ValueError(
                f"layer {self.name!r}: resaved_by_module must hold positive byte counts, "
                f"got {self.resaved_by_module}"
            )
        small = [nbytes for _, nbytes in self.small_resaved_by]
        if any(nbytes <= 0 for nbytes in small) or sum(small) > sum(self.small_storages):
            raise ValueError(
                f"layer {self.name!r}: small_resaved_by must hold positive byte counts summing to "
                f"at most those of small_storages ({self.small_storages}), got {self.small_resaved_by}"
            )

    @property
    def resident_bytes(self) -> int:
        """Bytes that stay on the device whatever the plan says."""
        return self.saved_bytes - self.swappable_bytes


@dataclass(frozen=True)
class SegmentProfile:
    """A module invocation the plan may recompute: its qualified name, its inputs' and outputs' bytes.

    A recomputed segment runs under non-reentrant checkpointing: in forward only its tensor
    inputs are saved (``input_bytes``, the sum of their distinct storages), and its forward
    runs again in backward. ``output_bytes`` (distinct storages of its tensor outputs that
    are not inputs) is what a later layer may save first once the segment saves nothing.
    ``input_sources`` lists, as ``(earlier segment, bytes)``, the bytes of its input storages
    that are outputs of an earlier segment's call (for every earlier segment whose outputs hold
    them; empty when unknown): when that segment is recomputed too, they are first saved here.
    The segment covers the profile's layers named ``name`` or ``name.<anything>`` (which
    must be consecutive in the profile). Only modules called once per pass, not already
    under someone else's checkpointing and with no module inside them also called outside them
    (whose layers would carry their name) are listed.

    Selective recomputation (only measured when asked for) keeps what the segment's
    :data:`SELECTIVE_KEPT_OPS` write and runs every other op again in backward:
    ``selective_kept_bytes`` is what it then holds beyond the inputs (the distinct storages
    those ops write, less the inputs'), ``None`` when not measured (the segment is then never
    recomputed selectively); ``selective_recompute_share`` is the share of the segment's
    forward time the other ops take (what a selective recomputation costs again);
    ``selective_recomputed_bytes`` what those ops save for backward (the distinct storages
    saved inside the segment that are neither inputs nor kept: what a selective recomputation
    rebuilds while the segment's backward runs), ``None`` when not measured.

    ``recompute_seconds`` and ``selective_recompute_seconds`` are what recomputing it (whole,
    selectively) took when a training session timed it (its fastest), ``None`` when never
    timed: a plan then charges it the profile's ``recompute_cost_ratio`` times its forward.

    ``swappable_input_bytes`` (in ``swappable_input_storages`` storages) are the bytes of its
    inputs the engine may swap when it recomputes it whole: storages saved in the step, of at
    least ``min_swap_bytes``, not held by the step's code beyond the forward and not read by a
    backward inside it. None where an input is a view of part of a storage, is never saved, is
    saved again after the segment returns or is an input of a segment called later (the engine,
    swapping the segment's layer, would copy it too). A plan may swap them (the segment's layer)
    instead of keeping them on the device until its backward; 0 where not measured.

    Example:
        >>> SegmentProfile("layer1.0", input_bytes=802_816, output_bytes=802_816)
        SegmentProfile(name='layer1.0', input_bytes=802816, output_bytes=802816)
        >>> SegmentProfile("layer1.0", 802_816, selective_kept_bytes=1_605_632).selective_kept_bytes
        1605632
    """

    name: str
    input_bytes: int
    output_bytes: int = 0
    input_sources: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    selective_kept_bytes: int | None = field(default=None, repr=False)
    selective_recompute_share: float = field(default=1.0, repr=False)
    selective_recomputed_bytes: int | None = field(default=None, repr=False)
    recompute_seconds: float | None = field(default=None, repr=False)
    selective_recompute_seconds: float | None = field(default=None, repr=False)
    swappable_input_bytes: int = field(default=0, repr=False)
    swappable_input_storages: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.name or self.input_bytes < 0 or self.output_bytes < 0:
            raise ValueError(
                f"a segment needs a module name and input_bytes, output_bytes >= 0, got {self!r}"
            )
        storages = self.swappable_input_storages
        if not 0 <= self.swappable_input_bytes <= self.input_bytes or (
            storages < 0 or (storages > 0) != (self.swappable_input_bytes > 0)
        ):
            raise ValueError(
                f"segment {self.name!r}: swappable_input_bytes must be in [0, input_bytes] and held in "
                f"at least one storage when above 0, got {self.swappable_input_bytes} bytes in "
                f"{self.swappable_input_storages} storages of {self.input_bytes} input bytes"
            )
        if any(not 0 < nbytes <= self.input_bytes for _, nbytes in self.input_sources):
            raise ValueError(
                f"segment {self.name!r}: input_sources must hold byte counts in (0, input_bytes], "
                f"got {self.input_sources}"
            )
        if (
            (self.selective_kept_bytes is not None and self.selective_kept_bytes < 0)
            or (self.selective_recomputed_bytes is not None and self.selective_recomputed_bytes < 0)
            or not 0.0 <= self.selective_recompute_share <= 1.0
        ):
            raise ValueError(
                f"segment {self.name!r}: selective_kept_bytes must be >= 0 (or None) and "
                f"selective_recompute_share in [0, 1], got {self.selective_kept_bytes}, "
                f"{self.selective_recompute_share}"
            )
        for measured in (self.recompute_seconds, self.selective_recompute_seconds):
            if measured is not None and not 0.0 <= measured < float("inf"):
                raise ValueError(
                    f"segment {self.name!r}: a recomputation's measured seconds must be finite and "
                    f">= 0 (or None), got {measured}"
                )

    def covers(self, layer_name: str) -> bool:
        """Whether the profile layer ``layer_name`` runs inside this segment.

        Example:
            >>> segment = SegmentProfile("block", 0)
            >>> segment.covers("block.conv#2"), segment.covers("block"), segment.covers("blocks.0")
            (True, True, False)
        """
        base = layer_name.split("#", 1)[0]
        return base == self.name or base.startswith(self.name + ".")


@dataclass(frozen=True)
class ExcludedSegment:
    """A module invocation that is not recomputed, because a recomputation would not replay it
    exactly (or would not free what the profile names inside it): its qualified name and why (a
    call that changes module state, an argument written in place after the call, a module inside
    it also called outside it, a recomputation that failed in an earlier step).

    Example:
        >>> ExcludedSegment("layers.0.attn", "calling it changes its arguments")
        ExcludedSegment(name='layers.0.attn', reason='calling it changes its arguments')
    """

    name: str
    reason: str


@dataclass(frozen=True)
class StepProfile:
    """A whole training step: the layers, the static memory and the host link.

    ``static_bytes`` is everything that is not a saved activation: parameters, gradients,
    optimizer state and buffers. Bandwidths are bytes per second over pinned memory.
    ``segments`` lists the module invocations a plan may recompute (empty: none), and
    ``excluded_segments`` those found unsafe to recompute, with why (and, where selective
    recomputation was measured, segments still listed in ``segments`` that are never
    recomputed selectively, with why).
    ``resaves_listed`` says that the layers' ``resaved_by`` list every storage of swappable
    bytes saved again by a later layer (a profile the engine measured, or a trace); without it
    (a hand-written profile) recomputation is accounted on the safe side: a segment's outputs
    may be saved inside it and again after it.
    ``recompute_cost_ratio`` is what recomputing a segment in backward takes, over the forward
    time of the layers it runs again: 1.0 unless measured. A training session measures it in the
    passes it times under a plan that recomputes; it is above 1 where the host issues the
    recomputed kernels more slowly than the device runs them, or where checkpointing's own
    work is not small next to the segment's.
    ``outside_working_bytes`` is what the step holds beyond ``static_bytes`` between the passes
    (the optimizer step's temporaries): 0 when not measured.
    ``static_not_held_bytes`` is, of ``static_bytes``, the most the step may not hold where its
    forward working memory and the working memory between the passes were measured (the
    parameters' gradients before its backward makes them, autocast's weight copies before its
    forward makes them and after they go with it): such a figure is what the step held beyond
    the level less up to that much, which does not grow with the batch
    (:func:`lightning_accudnn.planner.scale_profile`); a layer's
    ``backward_static_not_held_bytes`` says the same of its backward level (0: none assumed).
    ``swapped_pass_forward_bytes`` lists, per layer (by name), what a pass that swapped every
    swappable save and let each go once the next layer's were out (a training session's
    profiling pass) held at the layer's forward level beyond its ledger: its working memory
    and the swapped storages the model's code still held then. Such a pass holds what a
    recomputed segment's forward, which saves nothing, holds, beside the saves it kept and the
    copies in flight (:func:`lightning_accudnn.planner.recompute.swapped_pass_forward_bound`). A
    trace lists what its forward held with its saves dropped
    (:mod:`lightning_accudnn.profiling.saveless_forward`). Empty where neither was measured.
    ``prefetch_order`` lists the swappable storages' records in the order the engine brings
    swapped ones back (by last save, the latest first), each as (its layer, its bytes, the bytes
    it takes in the prefetch window at least:
    :meth:`lightning_accudnn.ops.layers.SaveSequence.prefetch_order`); a training session's
    profiles list it from the pass's save sequence. The planner counts what the prefetch window
    holds when the backward starts from it, and only while its entries add up, layer by layer,
    to the layers' ``swappable_bytes`` (a profile scaled or merged since lists other bytes).
    Empty: not listed.
    ``swap_host_seconds`` is the host's time per swapped storage in the forward and in the
    backward: the engine's own work for it (its saved-tensor hooks, issuing its copy, bringing it
    back, releasing it; :attr:`lightning_accudnn.ops.StepStats.swap_host_seconds` over the
    storages swapped). A plan charges it on the compute stream, per layer's
    ``swappable_storages``: where the host computes (the CPU) it holds the compute up, whole. A
    training session measures it in the passes it times whole, on the CPU (on a GPU a host
    that runs ahead hides it, and how much shows is not measured); (0, 0) unless measured.
    ``static_let_go_in_backward`` lists, per layer, the part of ``static_bytes`` the step no
    longer holds while the layer's backward runs (empty: none): in a profile with segments
    recomputed (:func:`lightning_accudnn.planner.recompute.recomputed_profile`), the
    ``weight_copy_bytes`` of the recomputed layers before it, whose backward is still to come.
    Autocast's cache held them until the forward ended; their recomputation makes them again.
    (A recomputed layer's own copies are alive while its backward runs, and those of layers
    whose backward is over were let go in the measured pass too: its working memory shows it.)

    Example:
        >>> profile = StepProfile(
        ...     layers=(LayerProfile("a", 100, 100), LayerProfile("b", 50, 40)),
        ...     static_bytes=1_000,
        ... )
        >>> profile.saved_bytes, profile.swappable_bytes
        (150, 140)
    """

    layers: tuple[LayerProfile, ...]
    static_bytes: int
    d2h_bytes_per_second: float = float("inf")
    h2d_bytes_per_second: float = float("inf")
    segments: tuple[SegmentProfile, ...] = field(default=(), repr=False)
    resaves_listed: bool = field(default=False, repr=False)
    excluded_segments: tuple[ExcludedSegment, ...] = field(default=(), repr=False)
    recompute_cost_ratio: float = field(default=1.0, repr=False)
    outside_working_bytes: int = field(default=0, repr=False)
    static_not_held_bytes: int = field(default=0, repr=False)
    swapped_pass_forward_bytes: tuple[tuple[str, int], ...] = field(default=(), repr=False)
    static_let_go_in_backward: tuple[int, ...] = field(default=(), repr=False)
    prefetch_order: tuple[tuple[str, int, int], ...] = field(default=(), repr=False)
    swap_host_seconds: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def __post_init__(self) -> None:
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            raise ValueError("layer names in a StepProfile must be unique")
        segment_names = [segment.name for segment in self.segments]
        if len(set(segment_names)) != len(segment_names):
            raise ValueError("segment names in a StepProfile must be unique")
        if self.static_bytes < 0 or self.outside_working_bytes < 0:
            raise ValueError(
                f"static_bytes and outside_working_bytes must be >= 0, got {self.static_bytes}, "
                f"{self.outside_working_bytes}"
            )
        if self.static_not_held_bytes < 0:
            raise ValueError(f"static_not_held_bytes must be >= 0, got {self.static_not_held_bytes}")
        let_go = self.static_let_go_in_backward
        if let_go and (
            len(let_go) != len(self.layers) or not all(0 <= nbytes <= self.static_bytes for nbytes in let_go)
        ):
            raise ValueError(
                f"static_let_go_in_backward must hold, per layer ({len(self.layers)}), bytes in "
                f"[0, static_bytes={self.static_bytes}], got {let_go}"
            )
        if len(self.swap_host_seconds) != 2 or not all(
            0.0 <= s < float("inf") for s in self.swap_host_seconds
        ):
            raise ValueError(
                f"swap_host_seconds must be (forward, backward) seconds >= 0, got {self.swap_host_seconds}"
            )
        if not 0.0 < self.recompute_cost_ratio < float("inf"):
            raise ValueError(
                f"recompute_cost_ratio must be positive and finite, got {self.recompute_cost_ratio}"
            )
        position = {name: i for i, name in enumerate(names)}
        for i, layer in enumerate(self.layers):
            for later, _ in layer.resaved_by:
                if position.get(later, -1) < i:
                    raise ValueError(
                        f"layer {layer.name!r}: resaved_by names {later!r}, which is not this layer or a "
                        "later layer of the profile (a layer that saves a storage again must be listed, "
                        "with 0 saved bytes if it saves nothing new)"
                    )

    @property
    def saved_bytes(self) -> int:
        return sum(layer.saved_bytes for layer in self.layers)

    @property
    def swappable_bytes(self) -> int:
        return sum(layer.swappable_bytes for layer in self.layers)

    def with_min_swap_bytes(self, min_swap_bytes: int) -> StepProfile:
        """This profile as if ``min_swap_bytes`` were lower: the listed small storages of at
        least that size become swappable, and their listed re-saves (``small_resaved_by``)
        join ``resaved_by``.

        Example:
            >>> layer = LayerProfile("a", 100, 60, small_storages=(30, 10), small_resaved_by=(("b", 30),))
            >>> lowered = StepProfile((layer, LayerProfile("b", 0, 0)), 0).with_min_swap_bytes(20)
            >>> lowered.layers[0].swappable_bytes, lowered.layers[0].resaved_by
            (90, (('b', 30),))
        """
        layers = []
        for layer in self.layers:
            moved = tuple(size for size in layer.small_storages if size >= min_swap_bytes)
            resaved = dict(layer.resaved_by)
            for later, nbytes in layer.small_resaved_by:
                if nbytes >= min_swap_bytes:
                    resaved[later] = resaved.get(later, 0) + nbytes
            layers.append(
                replace(
                    layer,
                    swappable_bytes=layer.swappable_bytes + sum(moved),
                    swappable_storages=layer.swappable_storages + len(moved)
                    if layer.swappable_storages
                    else 0,
                    small_storages=tuple(size for size in layer.small_storages if size < min_swap_bytes),
                    resaved_by=tuple(resaved.items()),
                    small_resaved_by=tuple(
                        (later, nbytes) for later, nbytes in layer.small_resaved_by if nbytes < min_swap_bytes
                    ),
                )
            )
        return replace(self, layers=tuple(layers))

    @property
    def small_storages(self) -> tuple[int, ...]:
        """Sizes of every storage kept only for being below ``min_swap_bytes``."""
        return tuple(size for layer in self.layers for size in layer.small_storages)

    @property
    def has_working_bytes(self) -> bool:
        """Whether any working memory is listed (a layer's or between the passes)."""
        return self.outside_working_bytes > 0 or self.layers_have_working_bytes

    @property
    def layers_have_working_bytes(self) -> bool:
        """Whether a layer lists working memory (measured, or traced: a profile whose layers list
        none counts the ledger's bytes at each level, whatever it holds between the passes).

        Example:
            >>> profile = StepProfile((LayerProfile("a", 100, 100),), 0, outside_working_bytes=20)
            >>> profile.has_working_bytes, profile.layers_have_working_bytes
            (True, False)
        """
        return any(
            layer.forward_working_bytes or layer.backward_working_bytes or layer.retired_alive_bytes
            for layer in self.layers
        )

    def without_working_bytes(self) -> StepProfile:
        """This profile with no working memory listed: what the engine's ledger counts (itself
        when it lists none).

        Example:
            >>> layer = LayerProfile("a", 100, 100, forward_working_bytes=30, backward_working_bytes=50)
            >>> profile = StepProfile((layer,), 0, outside_working_bytes=20).without_working_bytes()
            >>> profile.has_working_bytes, profile.layers[0].backward_working_bytes
            (False, 0)
        """
        if not self.has_working_bytes:
            return self
        layers = tuple(
            replace(layer, forward_working_bytes=0, backward_working_bytes=0, retired_alive_bytes=0)
            for layer in self.layers
        )
        return replace(self, layers=layers, outside_working_bytes=0, swapped_pass_forward_bytes=())

    def rebased(self, static_bytes: int) -> StepProfile:
        """This step with ``static_bytes`` of static memory, its working memory measured against
        the static memory it counts now: bytes that move into the static count (autocast's
        weight copies, found by the pass that measured the working memory) leave the working
        memory, which held them, at every level (itself when the static memory is the same).
        The step does not hold them at every level (autocast's copies go with the forward):
        they join :attr:`static_not_held_bytes`.

        Example:
            >>> layer = LayerProfile("a", 100, 100, forward_working_bytes=30, backward_working_bytes=50)
            >>> rebased = StepProfile((layer,), 200, outside_working_bytes=20).rebased(240)
            >>> moved = rebased.layers[0]
            >>> rebased.static_bytes, moved.forward_working_bytes, moved.backward_working_bytes
            (240, -10, 10)
            >>> rebased.outside_working_bytes, rebased.static_not_held_bytes  # never below 0
            (0, 40)
        """
        moved = static_bytes - self.static_bytes
        if moved == 0:
            return self
        outside = max(0, self.outside_working_bytes - moved) if self.outside_working_bytes else 0
        shifted = self.with_working_bytes_added(-moved)
        if moved > 0 and self.has_working_bytes:
            shifted = shifted.with_static_not_held_added(moved)
        return replace(shifted, static_bytes=static_bytes, outside_working_bytes=outside)

    def with_static_not_held_added(self, nbytes: int) -> StepProfile:
        """This step with ``nbytes`` more of its static memory not held where its working memory
        was measured: :attr:`static_not_held_bytes` and each layer's
        ``backward_static_not_held_bytes`` (where listed) grown by that much.

        Example:
            >>> layer = LayerProfile("a", 100, 100, backward_static_not_held_bytes=30)
            >>> added = StepProfile((layer,), 200, static_not_held_bytes=50).with_static_not_held_added(20)
            >>> added.static_not_held_bytes, added.layers[0].backward_static_not_held_bytes
            (70, 50)
        """
        layers = tuple(
            layer
            if layer.backward_static_not_held_bytes is None
            else replace(layer, backward_static_not_held_bytes=layer.backward_static_not_held_bytes + nbytes)
            for layer in self.layers
        )
        return replace(self, layers=layers, static_not_held_bytes=self.static_not_held_bytes + nbytes)

    def backward_static_not_held(self, layer: LayerProfile) -> int:
        """Of the static memory, the most the step did not hold where ``layer``'s backward working
        memory was measured: the layer's figure, else :attr:`static_not_held_bytes`.

        Example:
            >>> profile = StepProfile((LayerProfile("a", 1, 1),), 200, static_not_held_bytes=50)
            >>> profile.backward_static_not_held(profile.layers[0])
            50
        """
        listed = layer.backward_static_not_held_bytes
        return self.static_not_held_bytes if listed is None else listed

    def with_working_bytes_added(self, nbytes: int) -> StepProfile:
        """This step with ``nbytes`` more working memory at every level of every layer, forward
        and backward, and at every forward level of the swapped pass
        (:attr:`swapped_pass_forward_bytes`; itself when ``nbytes`` is 0 or no layer lists
        working memory: the ledger's count alone); between the passes as it is.

        Example:
            >>> layer = LayerProfile("a", 100, 100, forward_working_bytes=-30, backward_working_bytes=5)
            >>> added = StepProfile((layer,), 0).with_working_bytes_added(40)
            >>> added.layers[0].forward_working_bytes, added.layers[0].backward_working_bytes
            (10, 45)
        """
        if nbytes == 0 or not self.layers_have_working_bytes:
            return self
        layers = tuple(
            replace(
                layer,
                forward_working_bytes=layer.forward_working_bytes + nbytes,
                backward_working_bytes=layer.backward_working_bytes + nbytes,
            )
            for layer in self.layers
        )
        swapped_pass = tuple((name, held + nbytes) for name, held in self.swapped_pass_forward_bytes)
        return replace(self, layers=layers, swapped_pass_forward_bytes=swapped_pass)

    @property
    def unconstrained_peak_bytes(self) -> int:
        """Peak device bytes with nothing swapped: static memory plus every activation."""
        return self.static_bytes + self.saved_bytes
