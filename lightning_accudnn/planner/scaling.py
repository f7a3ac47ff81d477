"""A measured profile carried to another batch shape of the same pass, and when a plan may be reused.

A pass with the same layer invocations in the same order but other tensor sizes (a new
sequence length under dynamic padding, another image size, the short last batch, the
tuner's candidate batch sizes) is planned from a scaled profile instead of a new profiling
step. The rules (:func:`scale_profile`):

* **Bytes from what was saved, when known.** Given the per-layer figures measured in a step
  of the new shape (``measured``: the engine's ``StepStats.layers`` of that step), each
  layer's saved and swappable bytes are those.
* **Else scaled, conservatively.** A shape change is two ratios (:class:`ShapeRatio`):
  ``batch``, the ratio of batch sizes (dimension 0), which every layer's bytes follow
  linearly, and ``extent``, the ratio of elements per sample (a sequence length, an image's
  pixels), which a layer's saved bytes follow as ``extent ** g`` with ``g`` its growth
  exponent: 1 for most layers (linear, convolution, norm outputs), 2 for attention weights
  saved by eager attention (``L x L`` per head), 0 for what does not depend on the extent (a
  pooled head). A layer's bytes become ``ceil(bytes * batch * extent ** g)``. Where ``g`` is
  not known (``growth=None``) the rule takes the bound over ``0 <= g <= max_growth``: bytes
  grow as ``extent ** max_growth`` when the extent grows and do not shrink when it shrinks.
  So an unknown layer is never under-counted while its exponent lies in that range, at the
  price of an over-count for linear layers until the step's own measurements refine the
  plan. :func:`fit_growth` learns ``g`` per layer from two measured shapes. The split
  between swappable and resident bytes scales with the layer (the ``min_swap_bytes``
  threshold is not re-applied: a storage that crosses it is only seen in measured bytes),
  ``resaved_by`` scales with the layer, and ``small_storages`` is dropped (unknown). A layer's
  working memory (``forward_working_bytes``, ``backward_working_bytes``: activations' gradients,
  a loss's logits) scales with its bytes too: measured where the new shape's figures list it,
  else by the layer's measured bytes ratio, else by its bytes factor. A working memory figure is
  what the step held beyond its level less the model state it did not hold then (the gradients
  the backward had not made yet), which does not grow: at a factor ``f > 1`` it becomes
  ``f * w + (f - 1) * s``, the held part grown and the part not held at most as it was (``s``:
  ``StepProfile.static_not_held_bytes`` in forward, the layer's
  ``backward_static_not_held_bytes`` in backward); a figure below 0 stays so, and scaling twice
  is scaling once by the product. What a pass that swapped everything held
  (``StepProfile.swapped_pass_forward_bytes``) is dropped: a recomputed segment's forward is
  then charged what its layers save.
* **Times follow the work.** Each layer's forward and backward seconds are multiplied by its
  bytes ratio when measured bytes are given (saved bytes and work grow alike: a matmul,
  convolution or attention saves inputs of the same shape as the work it does), else by
  ``batch * extent ** g`` with ``g`` the known exponent or 1 (the time is an estimate, not a
  bound; the conservative byte rule is for memory only).
* **The host link as measured**, static memory (model state) unchanged. The working memory
  between the passes (the optimizer's temporaries, which follow the parameters, beside the
  batch, which follows the shape) grows as a layer's at the largest bytes factor, and does not
  shrink.

A plan made for one shape covers another of the same pass (:func:`plan_covers`) when the
other's profile under that plan has a predicted peak (:class:`~.timeline.Simulator`, the
memory contract's issue-order peak) no higher than the plan's own prediction: the budget the
plan was checked against still holds, whatever the shape's times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

__all__ = [
    "DEFAULT_MAX_GROWTH",
    "ShapeRatio",
    "borrowed_measurements",
    "fit_growth",
    "plan_covers",
    "scale_profile",
    "shape_ratio",
]

#: Growth exponent assumed for a layer whose exponent is unknown: attention weights grow with
#: the square of the sequence length (or of the number of image patches).
DEFAULT_MAX_GROWTH = 2.0


@dataclass(frozen=True)
class ShapeRatio:
    """How a batch shape relates to the profiled one: ``batch`` sizes and ``extent`` per sample.

    Example:
        >>> ShapeRatio(batch=0.5, extent=2.0).elements
        1.0
    """

    batch: float
    extent: float = 1.0

    def __post_init__(self) -> None:
        if not (self.batch > 0 and math.isfinite(self.batch)):
            raise ValueError(f"ShapeRatio.batch must be a finite number > 0, got {self.batch}")
        if not (self.extent > 0 and math.isfinite(self.extent)):
            raise ValueError(f"ShapeRatio.extent must be a finite number > 0, got {self.extent}")

    @property
    def elements(self) -> float:
        """The ratio of batch elements."""
        return self.batch * self.extent


def shape_ratio(profiled: Sequence[Sequence[int]], new: Sequence[Sequence[int]]) -> ShapeRatio:
    """The :class:`ShapeRatio` between two batches given as the shapes of their tensors.

    Dimension 0 is the batch size (taken from the first tensor with a dimension); the extent
    is the largest ratio, over the tensors, of elements per sample, so that the growth of the
    fastest-growing input is what the rule assumes. The two batches must have the same
    number of tensors with the same ranks.

    Example:
        >>> shape_ratio([(8, 128), (8, 128)], [(8, 64), (8, 64)])  # shorter sequences
        ShapeRatio(batch=1.0, extent=0.5)
        >>> shape_ratio([(8, 3, 32, 32)], [(4, 3, 64, 64)])
        ShapeRatio(batch=0.5, extent=4.0)
    """
    if len(profiled) != len(new) or any(len(a) != len(b) for a, b in zip(profiled, new, strict=True)):
        raise ValueError(
            f"shape_ratio needs batches with the same tensors and ranks, got {list(profiled)} and {list(new)}"
        )
    pairs = [(tuple(a), tuple(b)) for a, b in zip(profiled, new, strict=True) if len(a) > 0]
    if not pairs:
        return ShapeRatio(1.0, 1.0)
    if any(0 in a or 0 in b for a, b in pairs):
        raise ValueError(f"shape_ratio needs non-empty tensors, got {list(profiled)} and {list(new)}")
    batch = pairs[0][1][0] / pairs[0][0][0]
    extent = max(math.prod(b[1:]) / math.prod(a[1:]) for a, b in pairs)
    return ShapeRatio(batch, extent)


def _layer_factors(
    count: int, ratio: ShapeRatio, growth: Sequence[float | None] | None, max_growth: float
) -> tuple[list[float], list[float]]:
    """(bytes factor, time factor) per layer without measurements."""
    if growth is not None and len(growth) != count:
        raise ValueError(f"growth has {len(growth)} entries for a profile of {count} layers")
    bytes_factors, time_factors = [], []
    for i in range(count):
        known = None if growth is None else growth[i]
        if known is None:
            exponent = max_growth if ratio.extent > 1 else 0.0
            time_exponent = 1.0
        else:
            exponent = time_exponent = known
        bytes_factors.append(ratio.batch * ratio.extent**exponent)
        time_factors.append(ratio.batch * ratio.extent**time_exponent)
    return bytes_factors, time_factors


def scale_profile(
    profile: StepProfile,
    ratio: ShapeRatio | float,
    *,
    measured: Sequence[LayerProfile] | None = None,
    growth: Sequence[float | None] | None = None,
    max_growth: float = DEFAULT_MAX_GROWTH,
) -> StepProfile:
    """``profile`` carried to a batch shape ``ratio`` away (a float: a batch-size ratio).

    ``measured`` (the new shape's own per-layer figures, same layers in the same order) gives
    the bytes; otherwise bytes are scaled by the layer's growth exponent (``growth``, one per
    layer, ``None`` for unknown) or conservatively (see the module docstring). Times follow
    the work, the link and the static memory are unchanged. Pure: no rounding down anywhere.

    Example:
        >>> profile = StepProfile(
        ...     (LayerProfile("proj", 100, 80, 1e-3, 2e-3), LayerProfile("attn", 50, 50, 1e-3, 1e-3)),
        ...     static_bytes=1_000)
        >>> longer = scale_profile(profile, ShapeRatio(batch=1.0, extent=2.0), growth=[1.0, 2.0])
        >>> [(layer.saved_bytes, layer.swappable_bytes) for layer in longer.layers]
        [(200, 160), (200, 200)]
        >>> unknown = scale_profile(profile, ShapeRatio(batch=1.0, extent=2.0))  # both as attention
        >>> [layer.saved_bytes for layer in unknown.layers], unknown.layers[0].forward_seconds
        ([400, 200], 0.002)
        >>> scale_profile(profile, 2.0).layers[0]  # the tuner: twice the batch
        LayerProfile(name='proj', saved_bytes=200, swappable_bytes=160, forward_seconds=0.002, \
backward_seconds=0.004)
    """
    if not isinstance(ratio, ShapeRatio):
        ratio = ShapeRatio(float(ratio))
    if not max_growth >= 0:
        raise ValueError(f"max_growth must be >= 0, got {max_growth}")
    layers = profile.layers
    if measured is not None:
        names = [layer.name for layer in measured]
        if names != [layer.name for layer in layers]:
            raise ValueError(
                "the measured layers are not the profiled pass's layers in the same order; a pass "
                "whose layers differ must be profiled, not scaled"
            )
        not_held = profile.static_not_held_bytes
        scaled = []
        sizes, fallback = _layer_factors(len(layers), ratio, growth, max_growth)
        for layer, now, size, other in zip(layers, measured, sizes, fallback, strict=True):
            known = layer.saved_bytes and now.saved_bytes
            work = now.saved_bytes / layer.saved_bytes if known else other
            grows = now.saved_bytes / layer.saved_bytes if known else size
            working = now.forward_working_bytes or now.backward_working_bytes
            scaled.append(
                replace(
                    now,
                    swappable_storages=layer.swappable_storages,
                    forward_seconds=layer.forward_seconds * work,
                    backward_seconds=layer.backward_seconds * work,
                    forward_working_bytes=(
                        now.forward_working_bytes
                        if working
                        else _scaled_working(layer.forward_working_bytes, grows, not_held)
                    ),
                    backward_working_bytes=(
                        now.backward_working_bytes
                        if working
                        else _scaled_working(
                            layer.backward_working_bytes, grows, profile.backward_static_not_held(layer)
                        )
                    ),
                    backward_static_not_held_bytes=(
                        now.backward_static_not_held_bytes
                        if working
                        else layer.backward_static_not_held_bytes
                    ),
                    retired_alive_bytes=(
                        now.retired_alive_bytes
                        if working
                        else _scaled_working(layer.retired_alive_bytes, grows)
                    ),
                )
            )
        factors = [
            now.saved_bytes / layer.saved_bytes
            for layer, now in zip(layers, measured, strict=True)
            if layer.saved_bytes and now.saved_bytes
        ]
        grown = max(factors, default=1.0)
        return replace(
            profile,
            layers=tuple(scaled),
            outside_working_bytes=_scaled_outside(profile, grown),
            segments=_scaled_segments(profile, grown),
            swapped_pass_forward_bytes=(),
            prefetch_order=(),  # another shape's records: a window admits more of smaller ones
        )
    bytes_factors, time_factors = _layer_factors(len(layers), ratio, growth, max_growth)
    not_held = profile.static_not_held_bytes
    scaled = []
    for layer, size, work in zip(layers, bytes_factors, time_factors, strict=True):
        saved = math.ceil(layer.saved_bytes * size)
        swappable = min(saved, math.ceil(layer.swappable_bytes * size))
        scaled.append(
            LayerProfile(
                layer.name,
                saved_bytes=saved,
                swappable_bytes=swappable,
                forward_seconds=layer.forward_seconds * work,
                backward_seconds=layer.backward_seconds * work,
                resaved_by=_scaled_resaves(layer.resaved_by, size, swappable),
                forward_working_bytes=_scaled_working(layer.forward_working_bytes, size, not_held),
                backward_working_bytes=_scaled_working(
                    layer.backward_working_bytes, size, profile.backward_static_not_held(layer)
                ),
                backward_static_not_held_bytes=layer.backward_static_not_held_bytes,
                retired_alive_bytes=_scaled_working(layer.retired_alive_bytes, size),
                swappable_storages=layer.swappable_storages,  # the same storages, of other sizes
            )
        )
    grown = max(bytes_factors, default=1.0)
    return replace(
        profile,
        layers=tuple(scaled),
        outside_working_bytes=_scaled_outside(profile, grown),
        segments=_scaled_segments(profile, grown),
        swapped_pass_forward_bytes=(),
        prefetch_order=(),  # another shape's records: a window admits more of smaller ones
    )


def borrowed_measurements(
    layer: LayerProfile, timed: LayerProfile, not_held: int = 0, backward_not_held: int = 0
) -> LayerProfile:
    """``layer``, from a pass that measured its bytes only (a pass replayed by ordinal times no
    layer and sees no re-saves), with what ``timed``, the same layer in a timed pass, measured:
    its times, re-saves, working memory and retired bytes still alive. Where the two saved other
    bytes (the timed pass ran another batch shape: a short batch runs a longer one's plan),
    these follow the ratio of the saved bytes, as :func:`scale_profile` carries a measured
    layer (``not_held`` and ``backward_not_held``: the model state the timed pass did not hold
    where it measured the forward's working memory and ``timed``'s backward's,
    :attr:`~lightning_accudnn.profile.StepProfile.static_not_held_bytes` and
    :meth:`~lightning_accudnn.profile.StepProfile.backward_static_not_held`); the re-saves never
    pass ``layer``'s swappable bytes.

    Example:
        >>> long = LayerProfile("tanh", 512, 512, 2e-3, 4e-3, resaved_by=(("fc2", 512),))
        >>> short = borrowed_measurements(LayerProfile("tanh", 256, 256), long)
        >>> short.forward_seconds, short.backward_seconds, short.resaved_by
        (0.001, 0.002, (('fc2', 256),))
    """
    if timed.saved_bytes == layer.saved_bytes or not (timed.saved_bytes and layer.saved_bytes):
        factor = 1.0
        forward_working, backward_working = timed.forward_working_bytes, timed.backward_working_bytes
        retired_alive, alive_from = timed.retired_alive_bytes, timed.retired_alive_from
    else:
        factor = layer.saved_bytes / timed.saved_bytes
        forward_working = _scaled_working(timed.forward_working_bytes, factor, not_held)
        backward_working = _scaled_working(timed.backward_working_bytes, factor, backward_not_held)
        retired_alive = _scaled_working(timed.retired_alive_bytes, factor)
        alive_from = _scaled_bytes(timed.retired_alive_from, factor)
    return replace(
        layer,
        forward_seconds=timed.forward_seconds * factor,
        backward_seconds=timed.backward_seconds * factor,
        resaved_by=_scaled_resaves(timed.resaved_by, factor, layer.swappable_bytes),
        resaved_by_module=_scaled_bytes(timed.resaved_by_module, factor),
        forward_working_bytes=forward_working,
        backward_working_bytes=backward_working,
        retired_alive_bytes=retired_alive,
        retired_alive_from=alive_from,
        backward_static_not_held_bytes=timed.backward_static_not_held_bytes,
    )


def _scaled_resaves(
    resaved_by: tuple[tuple[str, int], ...], factor: float, swappable_bytes: int
) -> tuple[tuple[str, int], ...]:
    """``LayerProfile.resaved_by`` at ``factor`` times the bytes (rounded up), in order, no more
    than ``swappable_bytes`` in all.

    Example:
        >>> _scaled_resaves((("b", 60), ("c", 40)), 1.5, 120)
        (('b', 90), ('c', 30))
    """
    resaved, left = [], swappable_bytes
    for later, nbytes in resaved_by:
        moved = min(left, math.ceil(nbytes * factor))
        if moved:
            resaved.append((later, moved))
            left -= moved
    return tuple(resaved)


def _scaled_bytes(listed: tuple[tuple[str, int], ...], factor: float) -> tuple[tuple[str, int], ...]:
    """Bytes listed by name, each ``factor`` times as many (rounded up)."""
    return tuple((name, math.ceil(nbytes * factor)) for name, nbytes in listed)


def _scaled_working(nbytes: int, factor: float, not_held: int = 0) -> int:
    """Working memory at ``factor`` times the activations, measured net of up to ``not_held``
    bytes of model state not allocated then (which do not grow with the batch): the held part
    grows by ``factor``, the part not held stays at most as it was. Known (``not_held > 0``),
    the figure may stay below 0, so that scaling again composes (``f`` then ``g`` is ``f * g``);
    not known, a figure below 0 counts as none.

    Example:
        >>> _scaled_working(100, 1.5), _scaled_working(-100, 1.5), _scaled_working(100, 0.5)
        (150, 0, 50)
        >>> _scaled_working(-100, 1.5, not_held=400)  # held 300 or less: 450 less 400 at most
        50
        >>> _scaled_working(-300, 1.5, not_held=400), _scaled_working(-100, 0.5, not_held=400)
        (-250, -50)
        >>> _scaled_working(_scaled_working(-300, 1.5, 400), 2.0, 400) == _scaled_working(-300, 3.0, 400)
        True
    """
    if not_held <= 0:
        return math.ceil(max(0, nbytes) * factor)
    return math.ceil(nbytes * factor + max(0.0, factor - 1.0) * not_held)


def _scaled_outside(profile: StepProfile, factor: float) -> int:
    """The working memory between the passes at ``factor`` times the activations: grown as a
    layer's (:func:`_scaled_working`; it holds the batch) when ``factor > 1``, else as it is
    (the optimizer's temporaries do not shrink).

    Example:
        >>> profile = StepProfile((), 1_000, outside_working_bytes=200, static_not_held_bytes=100)
        >>> _scaled_outside(profile, 1.5), _scaled_outside(profile, 0.5)
        (350, 200)
    """
    if factor <= 1.0:
        return profile.outside_working_bytes
    return _scaled_working(profile.outside_working_bytes, factor, profile.static_not_held_bytes)


def _scaled_segments(profile: StepProfile, factor: float) -> tuple[SegmentProfile, ...]:
    """The segments' input, output (and selectively kept) bytes grown by the largest factor
    any layer's bytes grew (their input sources and swappable inputs dropped: accounted on the
    safe side, their inputs kept; their timed recomputations too: the profile's cost ratio
    charges them, on the scaled forward)."""
    return tuple(
        replace(
            segment,
            input_bytes=math.ceil(segment.input_bytes * factor),
            output_bytes=math.ceil(segment.output_bytes * factor),
            input_sources=(),
            selective_kept_bytes=_grown(segment.selective_kept_bytes, factor),
            selective_recomputed_bytes=_grown(segment.selective_recomputed_bytes, factor),
            recompute_seconds=None,
            selective_recompute_seconds=None,
            swappable_input_bytes=0,
            swappable_input_storages=0,
        )
        for segment in profile.segments
    )


def _grown(nbytes: int | None, factor: float) -> int | None:
    return None if nbytes is None else math.ceil(nbytes * factor)


def fit_growth(
    profile: StepProfile,
    other: StepProfile,
    ratio: ShapeRatio,
    max_growth: float = DEFAULT_MAX_GROWTH,
) -> tuple[float | None, ...]:
    """Each layer's growth exponent, from ``profile`` and ``other`` measured ``ratio`` away.

    ``g = log(other_bytes / (profile_bytes * batch)) / log(extent)``, clipped to
    ``[0, max_growth]``; ``None`` where it cannot be told (the extent did not change, a
    layer saved nothing in either). The two profiles must have the same layers in order.

    Example:
        >>> a = StepProfile((LayerProfile("proj", 100, 100), LayerProfile("attn", 50, 50)), 0)
        >>> b = StepProfile((LayerProfile("proj", 200, 200), LayerProfile("attn", 200, 200)), 0)
        >>> fit_growth(a, b, ShapeRatio(1.0, 2.0))
        (1.0, 2.0)
    """
    if [layer.name for layer in profile.layers] != [layer.name for layer in other.layers]:
        raise ValueError("fit_growth needs two profiles of the same pass (the same layers in order)")
    if ratio.extent == 1.0:
        return (None,) * len(profile.layers)
    exponents: list[float | None] = []
    for before, after in zip(profile.layers, other.layers, strict=True):
        if before.saved_bytes == 0 or after.saved_bytes == 0:
            exponents.append(None)
            continue
        exponent = math.log(after.saved_bytes / (before.saved_bytes * ratio.batch)) / math.log(ratio.extent)
        exponents.append(min(max_growth, max(0.0, exponent)))
    return tuple(exponents)


def plan_covers(plan: Plan, profile: StepProfile) -> bool:
    """Whether ``plan`` may run a pass whose profile is ``profile`` (another shape, same pass).

    True when the layers are the plan's, in order, and ``profile``'s predicted peak under the
    plan's choice (swap set, copy-out limit, prefetch window) is at most the plan's predicted
    peak, so the budget the plan was made for holds. Give ``profile`` as
    :func:`scale_profile` makes it (measured bytes where known, else the conservative rule).

    Example:
        >>> from lightning_accudnn.planner.plan import plan_swaps
        >>> layers = tuple(LayerProfile(n, 100, 100, 1e-3, 2e-3) for n in "abcd")
        >>> profile = StepProfile(layers, static_bytes=1_000)
        >>> plan = plan_swaps(profile, budget_bytes=1_300)
        >>> plan_covers(plan, scale_profile(profile, ShapeRatio(1.0, 0.5), growth=[1.0] * 4))
        True
        >>> plan_covers(plan, scale_profile(profile, ShapeRatio(1.0, 1.5), growth=[1.0] * 4))
        False
    """
    if [layer.name for layer in plan.profile.layers] != [layer.name for layer in profile.layers]:
        return False
    return plan.peak_bytes_on(profile) <= plan.predicted_peak_bytes
