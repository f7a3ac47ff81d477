"""What a step reports: the figures the engine measured, per saving layer and in all.

A hooked (profiled) pass records who saved what (:class:`.SaveSequence`), times the layers and
notes the records saved again by a later layer; its layers come from :func:`layer_usage`. A
pass replayed by ordinal is not timed: its layers' bytes are those of the profiled pass for
the saves it took on the fast path, plus what its records counted (:class:`ReplayedLayers`).
None of this runs per saved tensor but :func:`note_resave`, in hooked passes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_accudnn.ops.layers import SWAPPABLE, LayerTracker, SaveSequence
from lightning_accudnn.ops.replay import ReplayRoute
from lightning_accudnn.ops.saves import StepState
from lightning_accudnn.ops.stash import StorageRecord
from lightning_accudnn.ops.timing import LayerTimer
from lightning_accudnn.ops.working_memory import WorkingMemory
from lightning_accudnn.profile import ROOT_LAYER, LayerProfile, resave_position


@dataclass(frozen=True)
class StepStats:
    """What the engine measured over one step (forward and backward).

    ``ledger_peak_bytes`` is the peak of the engine's ledger: model state plus saved
    activations, as the engine counts them (on CUDA the allocator's figures sit beside it).

    Example:
        >>> stats = StepStats(100, 100, 0.0, 500, 1, 0.01, 0.02, layers=())
        >>> stats.ledger_peak_bytes
        500
    """

    bytes_swapped_out: int
    bytes_swapped_in: int
    wait_seconds: float
    ledger_peak_bytes: int
    swapped_layers: int
    forward_seconds: float
    backward_seconds: float
    layers: tuple[LayerProfile, ...] = field(repr=False)
    """Per saving layer: bytes saved and swappable, forward self time, a share of the backward.

    A layer's ``forward_seconds`` is its self time plus that of the layers before it which
    saved nothing (so the layers' times add up to the forward pass); ``backward_seconds``
    shares the measured backward time out in proportion to forward time. Times are zero in a
    pass replayed by ordinal (``timed`` false)."""
    timed: bool = True
    """Whether layers were hooked and timed (a pass run without a ``sequence``)."""
    sequence: SaveSequence | None = field(default=None, repr=False)
    """The saves of a hooked pass, to replay the next passes of the same graph by ordinal."""
    graph_changed: bool = False
    """A pass replayed by ordinal saved a different sequence: its layers are not to be trusted."""
    layers_read_in_forward: frozenset[str] = frozenset()
    """Layers (of a hooked pass) whose saves a backward inside the forward read (a gradient
    penalty): their saves outlive that backward, so their segments must not be recomputed."""
    observed: bool = True
    """Whether every save of the pass passed the engine's hooks. A pass replayed unobserved
    (see :meth:`OffloadEngine.offload`: no hook when it keeps everything, hooks up to its last
    swapped save otherwise) reports the layers and the ledger peak of the last observed pass
    of its sequence under the same schedule, and cannot see a change of the graph where no
    hook was."""
    storages_swapped_out: int = 0
    """Copies to the host in the step: one per swapped storage (or the part of one that a
    view lineage saved), however many times it was saved."""
    stall_seconds: tuple[float, float] = (0.0, 0.0)
    """A pass replayed with its waits timed (``OffloadEngine.offload(time_waits=True)``): how
    long compute waited on copies in its forward and in its backward, which its
    ``forward_seconds`` and ``backward_seconds`` hold; zeros otherwise (a hooked pass's times
    are without its waits already)."""
    swap_host_seconds: tuple[float, float] = (0.0, 0.0)
    """A pass replayed with its waits timed: the host's seconds in the engine's own work in its
    forward and in its backward (its saved-tensor hooks, issuing its copies, prefetching,
    releasing), less the waits on copies inside them that held the host
    (:class:`~lightning_accudnn.ops.timing.HostWorkTimer`); zeros otherwise. On the CPU, where
    the host computes, ``forward_seconds`` and ``backward_seconds`` hold it."""
    outside_working_bytes: int = 0
    """A hooked pass that measured its working memory (``OffloadEngine.offload(allocated_peak=...)``):
    what the device held beyond model state between the previous pass and this one (the
    optimizer's temporaries); 0 otherwise."""
    gradients_to_come_bytes: int = 0
    """A hooked pass that measured its working memory: the bytes of the parameters' gradients
    not made yet when it began (model state the device did not hold then); 0 otherwise."""
    autocast_past_forward: bool = False
    """Autocast was still enabled when the forward ended (the forward's context was left inside
    an autocast region): its cache, which holds the weight copies it made, may outlive the
    forward, and the backward may run while it does."""


class ReplayedLayers:
    """The layers a pass replayed by ordinal reports, the same objects again while they are
    the same as the last replayed pass's (a replayed step makes no new ones).

    Example:
        >>> sequence = SaveSequence()
        >>> sequence.append("fc", False, 64, tensor_bytes=64, kind=SWAPPABLE, record_bytes=64)
        >>> from lightning_accudnn.ops.schedule import SwapSchedule
        >>> route = ReplayRoute(sequence, SwapSchedule.keep_everything())
        >>> report = ReplayedLayers()
        >>> layers = report.layers(route, 1, StepState(sequence.sizes))
        >>> [(layer.name, layer.saved_bytes) for layer in layers]
        [('fc', 64)]
        >>> report.layers(route, 1, StepState(sequence.sizes)) is layers
        True
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[object, tuple[LayerProfile, ...]] | None = None

    def layers(self, route: ReplayRoute, end: int, step: StepState) -> tuple[LayerProfile, ...]:
        """Bytes per saving layer of a pass replayed on ``route`` up to ordinal ``end`` (where it
        ended, or departed from the sequence): the records of its fast saves and of its storages
        swapped whole are those of the profiled pass (:meth:`.ReplayRoute.layer_bytes`), the
        others counted now."""
        fast_saved, fast_swappable = route.layer_bytes(end)
        read_in_forward = fast_read_in_forward(route, step)
        key = (route, end, step.layer_saved, step.layer_swappable, read_in_forward)
        if self._last is not None and self._last[0] == key:
            return self._last[1]  # the same as the last replayed pass: no new objects
        swappable = dict(fast_swappable)
        sequence = route.sequence
        for ordinal in read_in_forward:
            layer = sequence.layers[ordinal]
            swappable[layer] -= sequence.record_bytes[ordinal]
        order = dict.fromkeys(route.first_records(end))
        order.update(dict.fromkeys(step.layer_saved))
        layers = tuple(
            LayerProfile(
                name,
                saved_bytes=fast_saved.get(name, 0) + step.layer_saved.get(name, 0),
                swappable_bytes=swappable.get(name, 0) + step.layer_swappable.get(name, 0),
            )
            for name in order
            if name in fast_saved or name in step.layer_saved
        )
        self._last = (key, layers)
        return layers


def fast_read_in_forward(route: ReplayRoute, step: StepState) -> frozenset[int]:
    """The swappable records (by opening ordinal) of fast saves unpacked in forward."""
    if not step.read_in_forward:
        return frozenset()
    sequence = route.sequence
    opened = {sequence.record_of[ordinal] for ordinal in step.read_in_forward}
    return frozenset(ordinal for ordinal in opened if sequence.kinds[ordinal] == SWAPPABLE)


def layer_usage(
    step: StepState, timer: LayerTimer, tracker: LayerTracker, working: WorkingMemory | None = None
) -> tuple[LayerProfile, ...]:
    """Bytes and times per saving layer of a hooked pass; time of layers that saved nothing
    goes to the next one, and the backward is shared out in proportion to forward time. With
    ``working``, each layer's working memory too."""
    self_seconds = timer.forward_self_seconds()
    forward: dict[str, float] = dict.fromkeys(step.layer_saved, 0.0)
    pending, last_saving = 0.0, None
    for layer in tracker.order:
        if layer == ROOT_LAYER:
            continue
        pending += self_seconds.get(layer, 0.0)
        if layer in forward:
            forward[layer] += pending
            pending, last_saving = 0.0, layer
    rest = pending + self_seconds.get(ROOT_LAYER, 0.0)
    if ROOT_LAYER in forward or last_saving is None:
        forward[ROOT_LAYER] = forward.get(ROOT_LAYER, 0.0) + rest
    else:
        forward[last_saving] += rest
    total_forward = sum(forward.values())
    backward = timer.backward_seconds()
    resaved, resaved_modules = resaved_by(step)
    return tuple(
        LayerProfile(
            name,
            saved_bytes=step.layer_saved.get(name, 0),
            swappable_bytes=step.layer_swappable.get(name, 0),
            forward_seconds=forward[name],
            backward_seconds=backward * forward[name] / total_forward if total_forward > 0 else 0.0,
            small_storages=tuple(step.layer_small.get(name, ())),
            resaved_by=tuple(resaved.get(name, {}).items()),
            resaved_by_module=tuple(resaved_modules.get(name, {}).items()),
            forward_working_bytes=0 if working is None else working.forward_bytes.get(name, 0),
            backward_working_bytes=0 if working is None else working.backward_bytes.get(name, 0),
            retired_alive_bytes=0 if working is None else working.retired_alive_bytes.get(name, 0),
            retired_alive_from=()
            if working is None
            else tuple(sorted(working.retired_alive_from.get(name, {}).items())),
            backward_static_not_held_bytes=None
            if working is None
            else working.backward_gradients_to_come.get(name, 0),
        )
        for name in forward
    )


def note_resave(step: StepState, record: StorageRecord, layer: str) -> None:
    """``layer`` saves ``record`` again in a hooked pass: noted where
    :func:`~lightning_accudnn.profile.resave_position` places it."""
    step.resaved_from[record], noted = resave_position(layer, step.layer_saved)
    if noted:
        step.resaved_module[record] = layer
    else:
        step.resaved_module.pop(record, None)


def resaved_by(step: StepState) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Per saving layer, the bytes of its swappable records saved again, under the layer
    (of the profile) from whose backward on they are needed (:attr:`.LayerProfile.resaved_by`),
    and the part of them saved again last by a layer that saved nothing of its own, under
    that layer (:attr:`.LayerProfile.resaved_by_module`)."""
    saving = list(step.layer_saved)
    resaved: dict[str, dict[str, int]] = {}
    modules: dict[str, dict[str, int]] = {}
    for record, index in step.resaved_from.items():
        later = saving[min(index, len(saving) - 1)]
        if later != record.layer and not record.read_in_forward:
            per_layer = resaved.setdefault(record.layer, {})
            per_layer[later] = per_layer.get(later, 0) + record.nbytes
            module = step.resaved_module.get(record)
            if module is not None:
                per_module = modules.setdefault(record.layer, {})
                per_module[module] = per_module.get(module, 0) + record.nbytes
    return resaved, modules
