"""What recomputing segments does to a profile: the step the engine then sees, layer by layer.

A recomputed segment (a module invocation, :class:`~lightning_accudnn.profile.SegmentProfile`)
runs under non-reentrant checkpointing. The engine then sees, in place of the segment's
layers, one layer named after the segment that saves only the segment's inputs (kept on the
device: the session's schedule keeps segment layers); the saves inside the segment go to the
checkpoint and the engine never sees them. In backward the segment's forward runs again
(its time is charged to the backward) and everything it saves is on the device while its
backward runs (a *transient*, which the timeline adds to that layer's backward level).

:func:`recomputed_profile` builds that step as a plain :class:`StepProfile`, so the swap
search and the two-stream simulator score it unchanged. Accounting (an upper bound on the
engine's ledger and on the device, never below either):

* the segment layer holds ``input_bytes`` from its forward to the end of its backward, even
  when an input's storage was saved before (the engine then deduplicates it);
* a storage first saved inside a recomputed segment and saved again by a later layer ``p``
  (``LayerProfile.resaved_by``) is, under recomputation, first saved by the engine at or
  after the first layer following the segment: it is counted as resident bytes of that
  layer (from its forward to the end of its backward, which covers every later first save),
  except the bytes the next segment, recomputed too, takes as inputs (matched by storage:
  ``SegmentProfile.input_sources``), which that segment's layer counts once. A recomputed
  segment's inputs that a kept layer saved first are not counted again by the segment when
  that layer's innermost segment made them (``input_sources``) and the segment saves that
  layer's storages again: a residual block's input, saved by the previous block's last
  activation. A re-save made before the segment, by a module outside it that saves nothing of
  its own (``LayerProfile.resaved_by_module``), shows no input of it, though it is listed under
  the segment's first layer (an attention block's output saved again by its projection, whose
  output the segment takes). The segment's
  outputs (``SegmentProfile.output_bytes``) are counted so too, less those re-saves: a
  profile that does not list re-saves (a FakeTensor trace's) still counts every output;
* a storage saved again by a layer inside a recomputed segment is taken as saved again by
  the segment layer (the latest position its last save can have);
* a storage saved again last by a module inside the segment that saves nothing of its own is
  listed under the next layer that does, after the segment (``LayerProfile.resaved_by_module``
  names the module): it never leaves the segment and is not counted after it.

Working memory (``LayerProfile.forward_working_bytes``, ``backward_working_bytes``, what the
ledger never sees) follows the layers: a kept layer keeps its own; a recomputed segment's layer
holds in forward, beyond its inputs, its layers' outputs while the next reads them (at most what
its layers save up to each, plus that layer's working memory; where the profile lists what a
pass that swapped everything held, ``StepProfile.swapped_pass_forward_bytes``, at most what that
pass held at each layer: :func:`swapped_pass_forward_bound`), and in backward, on top of
its transient, the most any of its layers holds while its backward runs *or while its forward
runs again* (the forward that rebuilds the saves runs inside that backward): the largest of its
layers' forward and backward working bytes, or, recomputed whole, less where the order its
saves are rebuilt and read in never has them all alive beside it
(:func:`rerun_backward_working_bytes`). The step's ``outside_working_bytes`` is unchanged.

Autocast's weight copies of a recomputed segment's layers (``LayerProfile.weight_copy_bytes``,
counted in the model state) live in autocast's cache until the forward ends and are made again
by the recomputation: the layers whose backward runs before the segment's hold them no more
(``StepProfile.static_let_go_in_backward``). The segment's own backward holds them again, and
a layer whose backward runs after it was measured without them already. Selective segments keep
theirs counted.

A segment recomputed **selectively** (:attr:`SegmentSpan.selective`) keeps what its matrix
products, convolutions and attention kernels write (``SegmentProfile.selective_kept_bytes``,
which the engine sees inside the segment and keeps) and runs its other ops again in backward:
its layer holds its inputs plus those kept bytes, it costs its forward time times
``selective_recompute_share`` in backward, and what its other ops save
(``selective_recomputed_bytes``; where not measured, all its saves, as for whole
recomputation) is a transient in its backward.

A segment recomputed **nested** (:func:`nested_span`: a stage with the blocks inside it
recomputed again inside its recomputation) is one layer as the stage alone is, whose backward
runs the stage's forward and each block's forward once more, and whose transient is what the
stage's recomputation rebuilds (the saves outside its blocks and the blocks' inputs) plus the
largest block's saves.

Example:
    >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
    >>> layers = (LayerProfile("stem", 40, 40, 1.0, 2.0), LayerProfile("block.conv", 100, 100, 1.0, 2.0),
    ...           LayerProfile("block.relu", 100, 100, 0.5, 1.0), LayerProfile("head", 10, 10, 0.1, 0.2))
    >>> profile = StepProfile(layers, static_bytes=0, segments=(SegmentProfile("block", 40),))
    >>> step = recomputed_profile(profile, candidate_spans(profile))
    >>> [(layer.name, layer.saved_bytes, layer.backward_seconds) for layer in step.profile.layers]
    [('stem', 40, 2.0), ('block', 40, 4.5), ('head', 10, 0.2)]
    >>> step.transient_bytes
    (0, 200, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar, cast

from lightning_accudnn.profile import ROOT_LAYER, LayerProfile, StepProfile, most_bytes_by_name

T = TypeVar("T")

__all__ = [
    "LastProfileMemo",
    "RecomputedProfile",
    "SegmentSpan",
    "candidate_spans",
    "inner_spans",
    "innermost_segments",
    "named_spans",
    "nested_span",
    "policy_spans",
    "rebuilding_working_bytes",
    "rerun_backward_working_bytes",
    "swapped_pass_forward_bound",
    "rerun_forward_working_bytes",
    "recomputed_profile",
    "resaved_inside",
    "set_key",
]


@dataclass(frozen=True)
class SegmentSpan:
    """A segment of a profile that recomputation would help: the layers it covers and their totals.

    ``first`` and ``last`` index the profile's layers (inclusive); ``saved_bytes`` and
    ``forward_seconds`` are the sums over them (what recomputation frees and costs again).

    ``selective`` spans are recomputed selectively: they hold ``kept_bytes`` more, run
    ``recompute_share`` of their forward time again and rebuild ``rebuilt_bytes`` of saves in
    backward (``None``: all their saves).

    ``swappable_input_bytes`` (in ``swappable_input_storages`` storages) are the bytes of its
    inputs the engine may swap when it recomputes the span whole
    (:attr:`~lightning_accudnn.profile.SegmentProfile.swappable_input_bytes`).

    ``recompute_ratio`` is what running a forward again in backward takes, over the forward
    time it repeats (the profile's :attr:`~lightning_accudnn.profile.StepProfile.recompute_cost_ratio`);
    ``measured_seconds``, when a session timed the recomputation, is what it took, charged
    instead.

    A span with ``inner`` spans (made by :func:`nested_span`) is recomputed with those recomputed
    again inside it (two-level checkpointing): see :func:`nested_span`.

    A span is immutable: its derived figures (``freed_bytes``, ``recompute_seconds``...) are
    computed on first use and kept (the searches read them millions of times).

    Example:
        >>> span = SegmentSpan("block", 1, 2, input_bytes=40, saved_bytes=200, forward_seconds=1.5)
        >>> span.freed_bytes, span.overlaps(SegmentSpan("other", 2, 3, 0, 1, 0.0))
        (160, True)
        >>> selective = SegmentSpan("block", 1, 2, 40, 200, 2.0, selective=True, kept_bytes=100,
        ...                         recompute_share=0.25)
        >>> selective.freed_bytes, selective.recompute_seconds
        (60, 0.5)
    """

    name: str
    first: int
    last: int
    input_bytes: int
    saved_bytes: int
    forward_seconds: float
    output_bytes: int = 0
    input_sources: tuple[tuple[str, int], ...] = ()
    selective: bool = False
    kept_bytes: int = 0
    recompute_share: float = 1.0
    rebuilt_bytes: int | None = None
    inner: tuple[SegmentSpan, ...] = ()
    recompute_ratio: float = 1.0
    measured_seconds: float | None = None
    swappable_input_bytes: int = 0
    swappable_input_storages: int = 0

    @cached_property
    def names(self) -> tuple[str, ...]:
        """The segments recomputing this span recomputes: its own, then its inner ones'."""
        return (self.name, *(span.name for span in self.inner))

    @cached_property
    def transient_bytes(self) -> int:
        """What its backward holds on top of everything else: the saves its recomputation rebuilds."""
        return self.saved_bytes if self.rebuilt_bytes is None else self.rebuilt_bytes

    @cached_property
    def sources(self) -> Mapping[str, int]:
        """``input_sources`` as a read-only mapping: earlier segment -> bytes of its outputs
        among the inputs."""
        return MappingProxyType(dict(self.input_sources))

    @cached_property
    def freed_bytes(self) -> int:
        """Saved bytes the segment no longer holds in forward."""
        return self.saved_bytes - self.input_bytes - self.kept_bytes

    @cached_property
    def held_bytes(self) -> int:
        """What the segment holds from its forward to its backward: its inputs (and, selective,
        what its expensive ops write)."""
        return self.input_bytes + self.kept_bytes

    @cached_property
    def recompute_seconds(self) -> float:
        """Forward time run again in backward (an inner span's twice: in this one's
        recomputation and in its own)."""
        return self.own_recompute_seconds + sum(span.recompute_seconds for span in self.inner)

    @cached_property
    def own_recompute_seconds(self) -> float:
        """Its own forward run again, the inner spans' recomputations left out: as measured, or
        :attr:`forward_again_seconds` times the ratio."""
        if self.measured_seconds is not None:
            return self.measured_seconds
        return self.forward_again_seconds * self.recompute_ratio

    @cached_property
    def forward_again_seconds(self) -> float:
        """The forward time its recomputation runs again (the recomputed share, selectively)."""
        return self.forward_seconds * self.recompute_share if self.selective else self.forward_seconds

    def __getstate__(self) -> dict[str, object]:
        """Pickled and copied: the fields alone (the derived figures are computed again)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    def overlaps(self, other: SegmentSpan) -> bool:
        return self.first <= other.last and other.first <= self.last

    def holds(self, other: SegmentSpan) -> bool:
        """Whether ``other`` lies within this span."""
        return self.first <= other.first and other.last <= self.last


class LastProfileMemo:
    """Answers about the last profile asked about, by key: a plan asks the same questions of
    one profile many times (its candidates, the segment around each layer). The profile is told
    apart by identity and kept alive while its answers are, so another profile never gets them
    (profiles are immutable); asking about another profile forgets them.

    Example:
        >>> memo = LastProfileMemo()
        >>> first, second = StepProfile((), 0), StepProfile((), 0)
        >>> memo.get(first, "layers", lambda: "first's"), memo.get(first, "layers", lambda: "again")
        ("first's", "first's")
        >>> memo.get(second, "layers", lambda: "second's")  # an equal profile, but another one
        "second's"
    """

    def __init__(self) -> None:
        self._entry: tuple[StepProfile, dict[object, object]] | None = None

    def get(self, profile: StepProfile, key: object, compute: Callable[[], T]) -> T:
        """The answer to ``key`` about ``profile``: kept, or ``compute()`` now and kept."""
        entry = self._entry  # read once: another thread may put another profile's in its place
        if entry is None or entry[0] is not profile:
            entry = self._entry = (profile, {})
        answers = entry[1]
        if key not in answers:
            answers[key] = compute()
        return cast(T, answers[key])


_memo = LastProfileMemo()


def candidate_spans(profile: StepProfile, *, selective: bool = False) -> tuple[SegmentSpan, ...]:
    """The profile's segments worth recomputing, in forward order (outer before inner).

    A segment qualifies when its layers are consecutive in the profile, it does not cover the
    root (work outside every module), and it saves more than it holds (its inputs; with
    ``selective``, its inputs and what its expensive ops write, for the segments whose
    selective recomputation was measured). Two segments covering the same layers are one
    candidate (the one that holds fewer bytes, then the outer one).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = (LayerProfile("a.x", 50, 50), LayerProfile("b", 50, 50), LayerProfile("a.y", 50, 50))
        >>> profile = StepProfile(layers, 0, segments=(SegmentProfile("a", 10),))
        >>> candidate_spans(profile)  # a's layers are not consecutive
        ()
    """
    return _memo.get(profile, ("candidates", selective), lambda: _candidate_spans(profile, selective))


def _candidate_spans(profile: StepProfile, selective: bool) -> tuple[SegmentSpan, ...]:
    """:func:`candidate_spans`, computed."""
    layers = profile.layers
    bases = [layer.name.split("#", 1)[0] for layer in layers]
    by_range: dict[tuple[int, int], SegmentSpan] = {}
    for segment in profile.segments:
        if selective and segment.selective_kept_bytes is None:
            continue
        inside = segment.name + "."
        # SegmentProfile.covers, on the layers' names without their call suffix
        covered = [i for i, base in enumerate(bases) if base == segment.name or base.startswith(inside)]
        if not covered or covered[-1] - covered[0] + 1 != len(covered):
            continue
        if any(layers[i].name == ROOT_LAYER for i in covered):
            continue
        span = SegmentSpan(
            segment.name,
            covered[0],
            covered[-1],
            segment.input_bytes,
            sum(layers[i].saved_bytes for i in covered),
            sum(layers[i].forward_seconds for i in covered),
            segment.output_bytes,
            segment.input_sources,
            selective,
            segment.selective_kept_bytes or 0 if selective else 0,
            segment.selective_recompute_share if selective else 1.0,
            segment.selective_recomputed_bytes if selective else None,
            recompute_ratio=profile.recompute_cost_ratio,
            measured_seconds=segment.selective_recompute_seconds if selective else segment.recompute_seconds,
            swappable_input_bytes=0 if selective else segment.swappable_input_bytes,
            swappable_input_storages=0 if selective else segment.swappable_input_storages,
        )
        if span.freed_bytes <= 0:
            continue
        key = (span.first, span.last)
        known = by_range.get(key)
        if known is None or span.held_bytes < known.held_bytes:
            by_range[key] = span
    return tuple(sorted(by_range.values(), key=lambda span: (span.first, -span.last)))


def policy_spans(profile: StepProfile, policy: str) -> tuple[SegmentSpan, ...]:
    """The candidates a plan under ``policy`` may recompute, in forward order: none under
    ``"swap"``, whole segments under ``"recompute"``, selective ones under ``"selective"``, and
    both under ``"auto"`` (a segment whose selective recomputation was measured is then two
    candidates over the same layers: they overlap, so a set holds at most one of them).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = (LayerProfile("b.x", 100, 100, 1.0), LayerProfile("b.y", 100, 100, 1.0))
        >>> segment = SegmentProfile("b", 10, selective_kept_bytes=50, selective_recompute_share=0.5)
        >>> profile = StepProfile(layers, 0, segments=(segment,))
        >>> [(span.name, span.selective) for span in policy_spans(profile, "auto")]
        [('b', False), ('b', True)]
    """
    if policy == "swap":
        return ()
    if policy == "recompute":
        return candidate_spans(profile)
    if policy == "selective":
        return candidate_spans(profile, selective=True)
    both = (*candidate_spans(profile), *candidate_spans(profile, selective=True))
    return tuple(sorted(both, key=lambda span: (span.first, -span.last, span.selective)))


def nested_span(outer: SegmentSpan, inner: Sequence[SegmentSpan], saved_bytes: Sequence[int]) -> SegmentSpan:
    """``outer`` recomputed whole with ``inner`` (whole, non-overlapping, strictly within it)
    recomputed again inside it: two-level checkpointing.

    In forward it holds what ``outer`` holds (its inputs). In backward the outer recomputation
    runs its forward with the inner segments checkpointed again, so it rebuilds the saves of its
    layers outside them (``saved_bytes``, per profile layer) and only the inner segments'
    inputs; each is freed once the backward has used it, and each inner segment is recomputed
    in its turn while its backward runs. Its transient is the most of: all the outer
    recomputation rebuilds (when it has just run), and for each inner segment, what the outer
    recomputation rebuilt up to and with that segment's inputs plus that segment's own saves.
    Its recompute time is the outer forward plus each inner forward once more.

    Example:
        >>> outer = SegmentSpan("s", 0, 3, 10, 400, 4.0)
        >>> inner = [SegmentSpan("s.b0", 0, 1, 10, 200, 1.0), SegmentSpan("s.b1", 2, 3, 20, 180, 3.0)]
        >>> span = nested_span(outer, inner, [100, 100, 90, 90])
        >>> span.names, span.transient_bytes, span.recompute_seconds, span.freed_bytes
        (('s', 's.b0', 's.b1'), 210, 8.0, 390)
    """
    chosen = tuple(sorted(inner, key=lambda span: span.first))
    if not chosen:
        raise ValueError(f"no inner segments to recompute inside {outer.name!r}")
    if outer.selective or outer.inner:
        raise ValueError(f"{outer.name!r} is recomputed selectively or nested already")
    for span in chosen:
        if (
            span.selective
            or span.inner
            or not outer.holds(span)
            or (span.first, span.last) == (outer.first, outer.last)
        ):
            raise ValueError(f"{span.name!r} is no whole segment strictly inside {outer.name!r}")
    for before, after in zip(chosen, chosen[1:], strict=False):
        if before.overlaps(after):
            raise ValueError(f"inner segments {before.name!r} and {after.name!r} overlap")
    # What the outer recomputation rebuilds at each layer, in forward order: an inner segment's
    # inputs at its first layer, the saves of a layer outside every inner segment at that layer.
    rebuilt = [0] * (outer.last - outer.first + 1)
    for i in range(outer.first, outer.last + 1):
        if not any(span.first <= i <= span.last for span in chosen):
            rebuilt[i - outer.first] = saved_bytes[i]
    for span in chosen:
        rebuilt[span.first - outer.first] += span.input_bytes
    prefix = [0]
    for nbytes in rebuilt:
        prefix.append(prefix[-1] + nbytes)
    peak = max(
        prefix[-1],
        *(prefix[span.first - outer.first + 1] + span.transient_bytes for span in chosen),
    )
    return replace(outer, rebuilt_bytes=peak, inner=chosen)


def inner_spans(outer: SegmentSpan, spans: Sequence[SegmentSpan]) -> tuple[SegmentSpan, ...]:
    """The whole candidates among ``spans`` directly inside ``outer`` (strictly within it and
    within no other such candidate), in forward order: what :func:`nested_span` recomputes
    inside it.

    Example:
        >>> spans = [SegmentSpan("s", 0, 3, 10, 400, 4.0), SegmentSpan("s.b0", 0, 1, 10, 200, 1.0),
        ...          SegmentSpan("s.b0.x", 0, 0, 10, 100, 1.0), SegmentSpan("s.b1", 2, 3, 20, 180, 3.0)]
        >>> [span.name for span in inner_spans(spans[0], spans)]
        ['s.b0', 's.b1']
    """
    within = [
        span
        for span in spans
        if not span.selective
        and not span.inner
        and outer.holds(span)
        and (span.first, span.last) != (outer.first, outer.last)
    ]
    direct = [span for span in within if not any(other is not span and other.holds(span) for other in within)]
    picked: list[SegmentSpan] = []
    for span in sorted(direct, key=lambda span: (span.first, -span.last)):
        if all(not span.overlaps(other) for other in picked):
            picked.append(span)
    return tuple(picked)


def named_spans(
    profile: StepProfile, policy: str, recomputed: Sequence[str], selective: Sequence[str] = ()
) -> list[SegmentSpan]:
    """The spans of a plan that recomputes the segments ``recomputed`` (``selective`` of them
    selectively) under ``policy``: a whole segment inside another recomputed whole is recomputed
    nested in it (:func:`nested_span`). Missing segments are left out.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = tuple(LayerProfile(f"s.b{i}.{part}", 50, 50, 1.0) for i in range(2) for part in "xy")
        >>> segments = (SegmentProfile("s", 10), SegmentProfile("s.b0", 10), SegmentProfile("s.b1", 10))
        >>> profile = StepProfile(layers, 0, segments=segments)
        >>> [span.names for span in named_spans(profile, "recompute", ["s", "s.b0"])]
        [('s', 's.b0')]
    """
    wanted = {(name, name in selective) for name in recomputed}
    spans = [span for span in policy_spans(profile, policy) if (span.name, span.selective) in wanted]

    def within(span: SegmentSpan, outer: SegmentSpan) -> bool:
        return outer is not span and not outer.selective and not span.selective and outer.holds(span)

    result = []
    for outer in spans:
        if any(within(outer, other) for other in spans):
            continue  # recomputed inside another
        inner = [span for span in spans if within(span, outer)]
        saved = [layer.saved_bytes for layer in profile.layers]
        result.append(nested_span(outer, inner, saved) if inner else outer)
    return sorted(result, key=lambda span: span.first)


def set_key(chosen: Sequence[SegmentSpan]) -> tuple[tuple[str, bool], ...]:
    """What tells recompute sets apart: each span's name and whether it is selective.

    Example:
        >>> set_key([SegmentSpan("b", 0, 1, 10, 100, 1.0, selective=True)])
        (('b', True),)
    """
    return tuple((name, span.selective and name == span.name) for span in chosen for name in span.names)


@dataclass(frozen=True)
class RecomputedProfile:
    """The step the engine sees when ``spans`` are recomputed, and what the timeline adds.

    ``profile`` has one layer per segment in place of the segment's layers;
    ``transient_bytes[i]`` is what layer ``i`` of it holds on top while its backward runs
    (the recomputed segment's saves; 0 for other layers); ``origin[i]`` lists the original
    layers' indices behind layer ``i``.

    Example:
        >>> from lightning_accudnn.profile import LayerProfile
        >>> step = recomputed_profile(StepProfile((LayerProfile("a", 1, 1),), 0), ())
        >>> step.origin, step.recomputed, step.selective
        (((0,),), (), ())
    """

    profile: StepProfile
    transient_bytes: tuple[int, ...]
    origin: tuple[tuple[int, ...], ...]
    recomputed: tuple[str, ...]
    spans: tuple[SegmentSpan, ...] = ()
    """The recomputed spans, in forward order (a nested one holds its inner spans; ``recomputed``
    names them all)."""

    @property
    def recompute_seconds(self) -> float:
        """Forward time run again in backward."""
        return sum(span.recompute_seconds for span in self.spans)

    @property
    def selective(self) -> tuple[str, ...]:
        """The recomputed segments recomputed selectively."""
        return tuple(span.name for span in self.spans if span.selective)


def innermost_segments(profile: StepProfile) -> dict[int, str]:
    """Per layer that others save again (by index), the innermost segment it runs in: the
    segment whose outputs :func:`recomputed_profile` takes its re-saves to be (the last
    profile's answer is kept: a search asks for the same profile many times; read it, never
    change it).

    Example:
        >>> from lightning_accudnn.profile import LayerProfile, SegmentProfile
        >>> layers = (LayerProfile("s.b.relu", 10, 10, resaved_by=(("head", 10),)),
        ...           LayerProfile("head", 10, 10))
        >>> segments = (SegmentProfile("s", 1), SegmentProfile("s.b", 1))
        >>> innermost_segments(StepProfile(layers, 0, segments=segments))
        {0: 's.b'}
    """
    return _memo.get(profile, "innermost", lambda: _innermost_of(profile))


def _innermost_of(profile: StepProfile) -> dict[int, str]:
    innermost: dict[int, str] = {}
    for i, layer in enumerate(profile.layers):
        if layer.resaved_by:
            around = [segment.name for segment in profile.segments if segment.covers(layer.name)]
            if around:
                innermost[i] = max(around, key=len)
    return innermost


def _layer_index(profile: StepProfile) -> tuple[dict[str, int], list[int]]:
    """Each layer's position by name, and the layers others save again (kept for the last profile)."""

    def index() -> tuple[dict[str, int], list[int]]:
        layers = profile.layers
        return {layer.name: i for i, layer in enumerate(layers)}, [
            i for i, layer in enumerate(layers) if layer.resaved_by
        ]

    return _memo.get(profile, "layer index", index)


def resaved_inside(layer: LayerProfile, segment: str) -> int:
    """Bytes of ``layer``'s ``resaved_by_module`` saved again by a module inside ``segment``.

    Example:
        >>> layer = LayerProfile("b.x", 10, 10, resaved_by=(("c", 10),), resaved_by_module=(("b.y#2", 10),))
        >>> resaved_inside(layer, "b"), resaved_inside(layer, "bb")
        (10, 0)
    """
    total = 0
    for module, nbytes in layer.resaved_by_module:
        base = module.split("#", 1)[0]
        if base == segment or base.startswith(segment + "."):
            total += nbytes
    return total


def resaved_outside(layer: LayerProfile, segment: str) -> int:
    """Bytes of ``layer``'s ``resaved_by_module`` saved again by a module outside ``segment``.

    Example:
        >>> layer = LayerProfile("a", 10, 10, resaved_by=(("b.x", 10),), resaved_by_module=(("a.proj", 10),))
        >>> resaved_outside(layer, "b"), resaved_outside(layer, "a")
        (10, 0)
    """
    return sum(nbytes for _, nbytes in layer.resaved_by_module) - resaved_inside(layer, segment)


def rerun_forward_working_bytes(layers: Sequence[LayerProfile]) -> int:
    """What a recomputed segment made of ``layers`` holds beyond its forward level (its inputs)
    while its forward runs, at most: its layers' outputs are saved by none, but each is alive
    until the next reads it (a residual input longer), so it holds at most what its layers up to
    each save, plus that layer's own working memory.

    Example:
        >>> rerun_forward_working_bytes([LayerProfile("b.x", 10, 10, forward_working_bytes=30),
        ...                              LayerProfile("b.y", 40, 40, forward_working_bytes=-5)])
        45
    """
    most, held = None, 0
    for layer in layers:
        held += layer.saved_bytes
        level = held + layer.forward_working_bytes
        most = level if most is None else max(most, level)
    return 0 if most is None else most


def swapped_pass_forward_bound(
    before: LayerProfile | None,
    layers: Sequence[LayerProfile],
    in_flight_before: int,
    held: Mapping[str, int],
) -> int | None:
    """What a recomputed segment made of ``layers`` holds beyond its forward level (its inputs)
    while its forward runs, at most, from a pass that swapped every swappable save and let each
    go once the next layer's were out (``held``: what it held at each layer's forward level
    beyond its ledger, :attr:`~lightning_accudnn.profile.StepProfile.swapped_pass_forward_bytes`);
    ``None`` when that pass did not list one of the layers.

    The segment's forward saves nothing, so it holds what the model's code and its ops hold:
    no more than that pass held at each layer, which is its ledger's saves of the segment's
    layers kept so far and the copies in flight (those of the last layer before with bytes to
    copy, ``in_flight_before`` bytes as the first layer counted began, and the layer's own),
    plus ``held``. The layer ``before`` the segment (``None``: none) is counted too: a pass
    charges what runs before a layer's first save to the layer that saved last, and the
    segment's first module may save nothing.

    Example:
        >>> layers = [LayerProfile("b.x", 100, 90), LayerProfile("b.y", 100, 100)]
        >>> swapped_pass_forward_bound(None, layers, 40, {"b.x": 30, "b.y": 5})  # b.y: 10 kept + 90 + 100 + 5
        205
        >>> swapped_pass_forward_bound(LayerProfile("a", 40, 40), layers, 0, {"a": 300, "b.x": 30, "b.y": 5})
        340
        >>> swapped_pass_forward_bound(None, layers, 40, {"b.x": 30}) is None
        True
    """
    most, kept, in_flight = None, 0, in_flight_before
    for position, layer in enumerate(layers if before is None else (before, *layers)):
        beyond = held.get(layer.name)
        if beyond is None:
            return None
        if before is None or position:
            kept += layer.resident_bytes
        level = kept + in_flight + layer.swappable_bytes + beyond
        most = level if most is None else max(most, level)
        if layer.swappable_bytes:
            in_flight = layer.swappable_bytes
    return 0 if most is None else most


def _swapped_pass(profile: StepProfile) -> tuple[Mapping[str, int], list[int]]:
    """The profile's swapped pass by layer name, and per layer the swappable bytes of the last
    layer before it with some (what that pass had in flight as the layer began)."""

    def compute() -> tuple[Mapping[str, int], list[int]]:
        in_flight, last = [], 0
        for layer in profile.layers:
            in_flight.append(last)
            if layer.swappable_bytes:
                last = layer.swappable_bytes
        return dict(profile.swapped_pass_forward_bytes), in_flight

    return _memo.get(profile, "swapped pass", compute)


def _surviving(profile: StepProfile, layers: list[LayerProfile]) -> tuple[tuple[str, int, int], ...]:
    """The entries of ``profile``'s prefetch order whose layer is in ``layers`` as it was (a
    recomputed layer saves nothing; a segment's layer saves other bytes, under its name).
    The planner counts the window from them only if they add up to the layers' swappable
    bytes: a segment's layer that may be swapped lists none, and they do not."""
    if not profile.prefetch_order:
        return ()
    unchanged = {id(layer) for layer in profile.layers}
    names = {layer.name for layer in layers if id(layer) in unchanged}
    return tuple(entry for entry in profile.prefetch_order if entry[0] in names)


def rebuilding_working_bytes(layers: Sequence[LayerProfile]) -> int:
    """What a recomputed segment made of ``layers`` holds beyond its backward level and its
    transient while its backward runs: the most any of its layers holds while its forward runs
    again (the recomputation, inside that backward) or while its backward runs.

    Example:
        >>> rebuilding_working_bytes([LayerProfile("b.x", 10, 10, forward_working_bytes=30,
        ...                                         backward_working_bytes=20),
        ...                           LayerProfile("b.y", 10, 10, backward_working_bytes=25)])
        30
    """
    return max(
        (max(layer.forward_working_bytes, layer.backward_working_bytes) for layer in layers), default=0
    )


def rerun_backward_working_bytes(layers: Sequence[LayerProfile]) -> int:
    """What a segment made of ``layers``, recomputed whole, holds beyond its backward level and
    its transient (all its layers' saves) while its backward runs, following the order its
    saves are rebuilt in: the less of :func:`rebuilding_working_bytes` and what the saves
    alive at each moment leave room for (negative when they are never all alive at once).

    The recomputation saves the layers' tensors in order and each goes once its layer's backward
    read it. So while the forward runs again up to layer ``j`` (holding what it holds beyond its
    saves then, never less than nothing: model state not made yet in a forward may be made by
    then) the saves up to ``j`` are alive, beside what the last layer's backward holds beyond its
    saves (the gradient the segment's backward starts from, at most); and while layer ``j``'s
    backward runs, the saves up to ``j`` beside what it holds beyond them. Where that is more
    than :func:`rebuilding_working_bytes` (which counts every save rebuilt beside the most any
    layer holds, but not the gradient beside the forward run again), that is taken.

    Example:
        >>> layers = [LayerProfile("b.x", 100, 100, forward_working_bytes=30, backward_working_bytes=200),
        ...           LayerProfile("b.y", 100, 100, backward_working_bytes=25)]
        >>> rebuilding_working_bytes(layers)  # b.x's backward beside all 200 saved bytes
        200
        >>> rerun_backward_working_bytes(layers)  # b.x's backward beside its own 100: 300, less 200
        100
    """
    saved = rerun = 0
    most: int | None = None
    for layer in layers:
        saved += layer.saved_bytes
        rerun = max(rerun, saved + max(0, layer.forward_working_bytes))
        level = saved + layer.backward_working_bytes
        most = level if most is None else max(most, level)
    if most is None:
        return 0
    rebuilt = rerun + max(0, layers[-1].backward_working_bytes)
    return min(rebuilding_working_bytes(layers), max(most, rebuilt) - saved)


def recomputed_profile(
    profile: StepProfile,
    spans: Sequence[SegmentSpan],
    *,
    swappable: bool = True,
    keep_inputs: bool = False,
) -> RecomputedProfile:
    """``profile`` with ``spans`` (non-overlapping) recomputed; see the module docstring.

    With ``swappable`` false every layer's bytes are made resident (a keep-or-recompute policy);
    with ``keep_inputs`` the recomputed segments' inputs are (their layers swap nothing).
    """
    layers = profile.layers
    chosen = sorted(spans, key=lambda span: span.first)
    for before, after in zip(chosen, chosen[1:], strict=False):
        if before.overlaps(after):
            raise ValueError(f"recomputed segments {before.name!r} and {after.name!r} overlap")
    # The new layers (groups): their names, original indices and spans (None: a kept layer), side
    # by side (tuples of numbers where there is one per layer: the garbage collector stops
    # tracking those, so planning in a large process does not make it walk the whole heap); and
    # each profile layer's group
    position = [0] * len(layers)
    names: list[str] = []
    members: list[tuple[int, ...]] = []
    group_spans: list[SegmentSpan | None] = []
    ungrouped = 0  # the first profile layer not grouped yet
    for span in (*chosen, None):
        for i in range(ungrouped, len(layers) if span is None else span.first):
            position[i] = len(names)
            names.append(layers[i].name)
            members.append((i,))
            group_spans.append(None)
        if span is not None:
            for i in range(span.first, span.last + 1):
                position[i] = len(names)
            names.append(span.name)
            members.append(tuple(range(span.first, span.last + 1)))
            group_spans.append(span)
            ungrouped = span.last + 1
    index, resaving = _layer_index(profile)
    working = _memo.get(profile, "working", lambda: profile.layers_have_working_bytes)
    count = len(names)
    # Per profile layer that others save again: the innermost segment of the profile (recomputed
    # or not) it runs in, whose outputs its saves may be. Only that one: a layer deeper inside
    # a segment saves what the segment's outputs are made from, rarely the outputs themselves.
    innermost = innermost_segments(profile)
    extra_resident = [0] * count  # bytes first saved at or after this layer under recomputation
    # Per recomputed segment: bytes of its inputs that are outputs of an earlier segment, not
    # yet accounted for (``SegmentProfile.input_sources``, measured by storage).
    sources = {g: dict(span.sources) for g, span in enumerate(group_spans) if span is not None}
    leaving = [0] * count  # per recomputed segment: re-saved bytes first saved inside it
    covered = [0] * count  # per recomputed segment: its input bytes a kept layer before saves
    resaves: dict[int, dict[str, int]] = {}  # per group that has any

    def take(segment: int, source: str, nbytes: int) -> int:
        """As many of ``nbytes`` as are inputs of ``segment`` made by ``source``."""
        left = sources[segment].get(source, 0)
        taken = min(left, nbytes)
        if taken:
            sources[segment][source] = left - taken
        return taken

    def alive_from(listed: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
        """``LayerProfile.retired_alive_from`` of a new layer: each layer listed under the new
        layer it is in (a recomputed segment's layers under the segment, which never swaps);
        ``()`` (not listed) when one is not a profile layer."""
        merged: dict[str, int] = {}
        moved = False
        for origin, nbytes in listed:
            where = index.get(origin)
            if where is None:
                return ()
            name = names[position[where]]
            moved = moved or name != origin
            merged[name] = merged.get(name, 0) + nbytes
        return tuple(sorted(merged.items())) if moved else tuple(listed)

    def alive_from_all(inner: Sequence[LayerProfile]) -> tuple[tuple[str, int], ...]:
        """A recomputed segment's ``retired_alive_from``: per layer listed, the most any of its
        layers with retired bytes alive lists; ``()`` when one of them lists none."""
        lists = [alive_from(layer.retired_alive_from) for layer in inner if layer.retired_alive_bytes]
        return () if not all(lists) else most_bytes_by_name(*lists)

    for i in resaving:
        layer = layers[i]
        group = position[i]
        span = group_spans[group]
        # Re-saves listed after the segment but made inside it, by a layer that saves nothing of
        # its own (listed under the next layer that does, the one after the segment).
        inside = 0 if span is None else resaved_inside(layer, span.name)
        for later_name, nbytes in layer.resaved_by:
            later = position[index[later_name]]
            if later == group:
                continue
            if inside and later == group + 1:
                dropped = min(inside, nbytes)
                inside, nbytes = inside - dropped, nbytes - dropped
                if not nbytes:
                    continue
            target = group_spans[later]
            if span is None:
                name = names[later]
                made = resaves.setdefault(group, {})
                made[name] = made.get(name, 0) + nbytes
                if target is not None and i in innermost:  # the segment's inputs, saved here first?
                    # Not the bytes a module outside the segment saved again last (one before it
                    # is listed under its first layer); those after it too, on the safe side.
                    made_before = resaved_outside(layer, target.name)
                    covered[later] += take(later, innermost[i], max(0, nbytes - made_before))
                continue
            leaving[group] += nbytes
            if later == group + 1 and target is not None:  # the next segment's inputs, made here?
                nbytes -= take(later, span.name, nbytes)
            if nbytes and group + 1 < count:  # first saved by the engine at or after the next layer
                extra_resident[group + 1] += nbytes
    for g, (indices, span) in enumerate(zip(members, group_spans, strict=True)):
        if span is None or g + 1 >= count:
            continue
        following = group_spans[g + 1]
        # Outputs saved inside the segment and again after it without a listed re-save: in a
        # profile that lists re-saves, only among the bytes it cannot swap; outputs the next
        # segment takes as inputs are counted there.
        passed_on = sources[g + 1].get(span.name, 0) if following is not None else 0
        unlisted = max(0, span.output_bytes - leaving[g] - passed_on)
        if profile.resaves_listed:
            unlisted = min(unlisted, sum(layers[i].resident_bytes for i in indices))
        extra_resident[g + 1] += unlisted
    new_layers = []
    transient = []
    # Per new layer, the weight copies of the segments recomputed before it, let go when the
    # forward ended: while its backward runs theirs is still to come (see the module docstring).
    copies_let_go = []
    copies_before = 0
    for g, (name, indices, span) in enumerate(zip(names, members, group_spans, strict=True)):
        copies_let_go.append(min(copies_before, profile.static_bytes))
        if span is None:
            layer = layers[indices[0]]
            origins = alive_from(layer.retired_alive_from)
            if origins != layer.retired_alive_from:
                layer = replace(layer, retired_alive_from=origins)
            if swappable and not extra_resident[g] and not layer.resaved_by:
                new_layers.append(layer)  # unchanged, as below (most layers of a large profile)
                transient.append(0)
                continue
            resident = layer.resident_bytes + extra_resident[g]
            saved = layer.saved_bytes + extra_resident[g]
            swap_bytes = saved - resident if swappable else 0
            resaved = tuple(resaves[g].items()) if swap_bytes and g in resaves else ()
            if (
                swap_bytes == layer.swappable_bytes
                and saved == layer.saved_bytes
                and resaved == layer.resaved_by
            ):
                new_layers.append(layer)  # unchanged (most layers of a large profile)
                transient.append(0)
                continue
            new_layers.append(
                LayerProfile(
                    name,
                    saved_bytes=saved,
                    swappable_bytes=swap_bytes,
                    forward_seconds=layer.forward_seconds,
                    backward_seconds=layer.backward_seconds,
                    small_storages=layer.small_storages if swappable else (),
                    resaved_by=resaved,
                    forward_working_bytes=layer.forward_working_bytes,
                    backward_working_bytes=layer.backward_working_bytes,
                    retired_alive_bytes=layer.retired_alive_bytes,
                    retired_alive_from=layer.retired_alive_from,
                    swappable_storages=layer.swappable_storages if swap_bytes else 0,
                )
            )
            transient.append(0)
        else:
            inner = [layers[i] for i in indices]
            forward = sum(layer.forward_seconds for layer in inner)
            again = span.own_recompute_seconds + sum(nested.recompute_seconds for nested in span.inner)
            forward_working = 0
            if working:
                forward_working = rerun_forward_working_bytes(inner)
                if profile.swapped_pass_forward_bytes:
                    held, in_flight = _swapped_pass(profile)
                    first = span.first
                    preceding = layers[first - 1] if first else None
                    bound = swapped_pass_forward_bound(
                        preceding, inner, in_flight[first - 1 if first else 0], held
                    )
                    if bound is not None and bound < forward_working:
                        forward_working = bound
            # Its inputs the engine may swap, recomputed whole, less those a kept layer before it
            # saves (the engine keeps one record per storage, the first saver's; taken to be
            # swappable ones, so that what it never swaps stays counted on the device).
            swap_bytes = (
                max(0, span.swappable_input_bytes - min(span.input_bytes, covered[g]))
                if swappable and not keep_inputs and not span.selective
                else 0
            )
            new_layers.append(
                LayerProfile(
                    name,
                    saved_bytes=span.held_bytes - min(span.input_bytes, covered[g]) + extra_resident[g],
                    swappable_bytes=swap_bytes,
                    swappable_storages=span.swappable_input_storages if swap_bytes else 0,
                    forward_seconds=forward,
                    backward_seconds=sum(layer.backward_seconds for layer in inner) + again,
                    forward_working_bytes=forward_working,
                    retired_alive_bytes=max(layer.retired_alive_bytes for layer in inner),
                    retired_alive_from=alive_from_all(inner),
                    backward_working_bytes=(
                        0
                        if not working
                        else rerun_backward_working_bytes(inner)
                        if span.rebuilt_bytes is None and not span.inner
                        else rebuilding_working_bytes(inner)
                    ),
                )
            )
            saved = sum(layer.saved_bytes for layer in inner)
            if not span.selective and not any(nested.selective for nested in span.inner):
                copies_before += sum(layer.weight_copy_bytes for layer in inner)
            transient.append(saved if span.rebuilt_bytes is None else span.rebuilt_bytes)
    derived = StepProfile(
        tuple(new_layers),
        profile.static_bytes,
        profile.d2h_bytes_per_second,
        profile.h2d_bytes_per_second,
        resaves_listed=profile.resaves_listed,
        outside_working_bytes=profile.outside_working_bytes,
        static_not_held_bytes=profile.static_not_held_bytes,
        static_let_go_in_backward=tuple(copies_let_go) if copies_before else (),
        prefetch_order=_surviving(profile, new_layers),
        swap_host_seconds=profile.swap_host_seconds,
    )
    return RecomputedProfile(
        derived,
        tuple(transient),
        tuple(members),
        tuple(name for span in chosen for name in span.names),
        tuple(chosen),
    )
