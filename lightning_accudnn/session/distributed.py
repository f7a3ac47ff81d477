"""Ranks of a process group plan alike: agreed decisions to re-plan, one merged profile per pass.

Lightning-free (``torch.distributed`` only), so the DDP strategy and a Fabric or plain DDP
loop share it: pass ``coordinator=DistributedCoordinator()`` to the session on every rank.
Ranks agree only at agreement points (see :mod:`lightning_accudnn.session.coordination`), on
a gloo side group, so no pass runs a collective of its own and none waits behind NCCL's
gradient all-reduce or synchronises the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch.distributed as dist

from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile
from lightning_accudnn.session.coordination import RankCoordinator, ReplanRequest

__all__ = ["AGREE_EVERY_PASSES", "DistributedCoordinator", "merge_profiles"]

#: Passes between two agreements.
AGREE_EVERY_PASSES = 20


class DistributedCoordinator(RankCoordinator):
    """Ranks of a process group agree: any rank's request re-plans that pass on every rank,
    from one profile made of the largest bytes and times and the slowest link.

    Agreements happen after every ``every``-th pass (the same pass on every rank); one agreement is one
    ``all_gather_object`` of the ranks' requests, plus one of their profiles when something
    is to be planned. They run on a gloo group made at the first agreement (so every rank
    must reach it, as they do).

    Example:
        >>> coordinator = DistributedCoordinator(every=50)  # inside an initialised process group
    """

    def __init__(self, every: int = AGREE_EVERY_PASSES) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1 pass, got {every}")
        self.every = every
        self.collectives = 0
        self._passes = 0  # since the last agreement
        self._group: Any = None

    @property
    def shared(self) -> bool:
        return _distributed()

    def due(self) -> bool:
        self._passes += 1
        if self._passes >= self.every:
            self._passes = 0
            return True
        return False

    def agree(self, requests: Mapping[Hashable, ReplanRequest]) -> dict[Hashable, ReplanRequest]:
        merged: dict[Hashable, ReplanRequest] = {}
        for rank_requests in self._gather(dict(requests)):
            for key, request in rank_requests.items():
                merged[key] = merged.get(key, ReplanRequest()) | request
        return {key: request for key, request in merged.items() if request}

    def merge(self, profiles: Mapping[Hashable, StepProfile | None]) -> dict[Hashable, StepProfile]:
        gathered = self._gather(dict(profiles))
        merged = {}
        for key in profiles:
            given = [rank_profiles[key] for rank_profiles in gathered if rank_profiles.get(key) is not None]
            if given:
                merged[key] = merge_profiles(given)
        return merged

    def _gather(self, payload: dict[Hashable, Any]) -> list[dict[Hashable, Any]]:
        if not _distributed():
            return [payload]
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        gathered: list[dict[Hashable, Any] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, payload, group=self._group)
        self.collectives += 1
        return [rank_payload or {} for rank_payload in gathered]


def merge_profiles(profiles: Sequence[StepProfile]) -> StepProfile:
    """The profile that is safe for every rank: per layer the most bytes (working memory
    included) and the longest times (and the costliest recomputation).

    Ranks run the same model on equally shaped batches, so their layers match; if they do
    not, planning alike is impossible and the error names the first difference.

    Example:
        >>> a = StepProfile((LayerProfile("x", 10, 10, 1.0, 2.0),), static_bytes=5)
        >>> b = StepProfile((LayerProfile("x", 12, 12, 0.5, 3.0),), static_bytes=5)
        >>> merge_profiles([a, b]).layers[0]
        LayerProfile(name='x', saved_bytes=12, swappable_bytes=12, forward_seconds=1.0, backward_seconds=3.0)
    """
    first = profiles[0]
    names = [layer.name for layer in first.layers]
    for rank, other in enumerate(profiles[1:], start=1):
        other_names = [layer.name for layer in other.layers]
        if other_names != names:
            raise RuntimeError(
                f"rank 0 and rank {rank} ran different layers in the profiled step ({len(names)} vs "
                f"{len(other_names)} layer invocations); AccUDNN plans every rank alike, so every rank "
                "must run the same model on equally shaped batches (use drop_last=True)"
            )
    layers = []
    for index, name in enumerate(names):
        candidates = [p.layers[index] for p in profiles]
        saved = max(layer.saved_bytes for layer in candidates)
        most_resident = max(candidates, key=lambda layer: layer.resident_bytes)
        swappable = saved - most_resident.resident_bytes
        layers.append(
            LayerProfile(
                name,
                saved_bytes=saved,
                swappable_bytes=swappable,
                forward_seconds=max(layer.forward_seconds for layer in candidates),
                backward_seconds=max(layer.backward_seconds for layer in candidates),
                small_storages=most_resident.small_storages,
                resaved_by=_merged_resaves(candidates, swappable),
                resaved_by_module=_merged_resaved_modules(candidates),
                forward_working_bytes=max(layer.forward_working_bytes for layer in candidates),
                backward_working_bytes=max(layer.backward_working_bytes for layer in candidates),
                retired_alive_bytes=max(layer.retired_alive_bytes for layer in candidates),
                swappable_storages=max(layer.swappable_storages for layer in candidates),
                backward_static_not_held_bytes=max(
                    p.backward_static_not_held(p.layers[index]) for p in profiles
                ),
            )
        )
    return dataclasses.replace(
        first,
        layers=tuple(layers),
        static_bytes=max(p.static_bytes for p in profiles),
        d2h_bytes_per_second=min(p.d2h_bytes_per_second for p in profiles),
        h2d_bytes_per_second=min(p.h2d_bytes_per_second for p in profiles),
        segments=_merged_segments(profiles),
        excluded_segments=tuple(
            {entry.name: entry for p in reversed(profiles) for entry in p.excluded_segments}.values()
        ),
        recompute_cost_ratio=max(p.recompute_cost_ratio for p in profiles),
        swap_host_seconds=(
            max(p.swap_host_seconds[0] for p in profiles),
            max(p.swap_host_seconds[1] for p in profiles),
        ),
        outside_working_bytes=max(p.outside_working_bytes for p in profiles),
        static_not_held_bytes=max(p.static_not_held_bytes for p in profiles),
        swapped_pass_forward_bytes=_merged_swapped_passes(profiles),
        # the window admits the records of the rank it was listed on: kept where all are alike
        prefetch_order=first.prefetch_order
        if all(p.prefetch_order == first.prefetch_order for p in profiles)
        else (),
    )


def _merged_swapped_passes(profiles: Sequence[StepProfile]) -> tuple[tuple[str, int], ...]:
    """Per layer, the most any rank's swapped pass held, where every rank's lists it."""
    listed = [dict(profile.swapped_pass_forward_bytes) for profile in profiles]
    names = [name for name, _ in profiles[0].swapped_pass_forward_bytes]
    return tuple(
        (name, max(held[name] for held in listed)) for name in names if all(name in held for held in listed)
    )


def _merged_segments(profiles: Sequence[StepProfile]) -> tuple[SegmentProfile, ...]:
    """The segments every rank may recompute, each with the most input, output and selectively
    kept and rebuilt bytes any rank saw, the largest share recomputed selectively (measured
    for selective recomputation only where every rank measured it), the slowest timed
    recomputation (timed only where every rank timed it) and the fewest input bytes every rank
    may swap (with the most storages any rank swaps them in)."""
    common = set.intersection(*({segment.name for segment in p.segments} for p in profiles))
    seen: dict[str, list[SegmentProfile]] = {}
    for profile in profiles:
        for segment in profile.segments:
            if segment.name in common:
                seen.setdefault(segment.name, []).append(segment)
    return tuple(_merged_segment(name, seen[name]) for name in sorted(common))


def _merged_segment(name: str, segments: Sequence[SegmentProfile]) -> SegmentProfile:
    kept = [segment.selective_kept_bytes for segment in segments]
    rebuilt = [segment.selective_recomputed_bytes for segment in segments]
    whole = [segment.recompute_seconds for segment in segments]
    selective = [segment.selective_recompute_seconds for segment in segments]
    swappable = min(segment.swappable_input_bytes for segment in segments)
    return SegmentProfile(
        name,
        max(segment.input_bytes for segment in segments),
        max(segment.output_bytes for segment in segments),
        selective_kept_bytes=None if None in kept else max(n for n in kept if n is not None),
        selective_recompute_share=max(segment.selective_recompute_share for segment in segments),
        selective_recomputed_bytes=None if None in rebuilt else max(n for n in rebuilt if n is not None),
        recompute_seconds=None if None in whole else max(s for s in whole if s is not None),
        selective_recompute_seconds=None if None in selective else max(s for s in selective if s is not None),
        swappable_input_bytes=swappable,
        swappable_input_storages=max(segment.swappable_input_storages for segment in segments)
        if swappable
        else 0,
    )


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _merged_resaves(candidates: Sequence[LayerProfile], swappable: int) -> tuple[tuple[str, int], ...]:
    """Per later layer the most bytes any rank saw saved again there, within the merged swappable bytes."""
    most: dict[str, int] = {}
    for layer in candidates:
        for later, nbytes in layer.resaved_by:
            most[later] = max(most.get(later, 0), nbytes)
    total = sum(most.values())
    if total > swappable:  # ranks disagree on what is swappable: keep the proportions, within bounds
        most = {later: nbytes * swappable // total for later, nbytes in most.items()}
    return tuple((later, nbytes) for later, nbytes in most.items() if nbytes > 0)


def _merged_resaved_modules(candidates: Sequence[LayerProfile]) -> tuple[tuple[str, int], ...]:
    """Per module, the fewest bytes any rank saw it save again (:attr:`.LayerProfile.resaved_by_module`):
    those bytes are left out of the count after a recomputed segment, so the merged profile
    leaves out only what every rank saw."""
    fewest = dict(candidates[0].resaved_by_module)
    for layer in candidates[1:]:
        seen = dict(layer.resaved_by_module)
        fewest = {module: min(nbytes, seen[module]) for module, nbytes in fewest.items() if module in seen}
    return tuple(fewest.items())
