"""Ranks of a process group plan alike: one agreed decision to re-plan, one merged profile.

Lightning-free (``torch.distributed`` only), so the DDP strategy and a Fabric or plain DDP
loop share it: pass ``coordinator=DistributedCoordinator()`` to the session on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist

from lightning_accudnn.planner.coordination import RankCoordinator
from lightning_accudnn.profile import LayerProfile, SegmentProfile, StepProfile

__all__ = ["DistributedCoordinator", "merge_profiles"]


class DistributedCoordinator(RankCoordinator):
    """Ranks of a process group agree: any rank's reason to re-plan re-plans them all, and
    they plan from one profile made of the largest bytes and times and the slowest link.

    Example:
        >>> coordinator = DistributedCoordinator()  # inside an initialised process group
    """

    def any(self, flag: bool) -> bool:
        return self.max(float(flag)) > 0

    def max(self, value: float) -> float:
        if not _distributed():
            return value
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def merge(self, profile: StepProfile) -> StepProfile:
        if not _distributed():
            return profile
        profiles: list[StepProfile | None] = [None] * dist.get_world_size()
        dist.all_gather_object(profiles, profile)
        return merge_profiles([p for p in profiles if p is not None])


def merge_profiles(profiles: Sequence[StepProfile]) -> StepProfile:
    """The profile that is safe for every rank: per layer the most bytes and the longest times.

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
            )
        )
    return dataclasses.replace(
        first,
        layers=tuple(layers),
        static_bytes=max(p.static_bytes for p in profiles),
        d2h_bytes_per_second=min(p.d2h_bytes_per_second for p in profiles),
        h2d_bytes_per_second=min(p.h2d_bytes_per_second for p in profiles),
        segments=_merged_segments(profiles),
    )


def _merged_segments(profiles: Sequence[StepProfile]) -> tuple[SegmentProfile, ...]:
    """The segments every rank may recompute, each with the most input bytes any rank saw."""
    common = set.intersection(*({segment.name for segment in p.segments} for p in profiles))
    most: dict[str, int] = {}
    for profile in profiles:
        for segment in profile.segments:
            if segment.name in common:
                most[segment.name] = max(most.get(segment.name, 0), segment.input_bytes)
    return tuple(SegmentProfile(name, most[name]) for name in sorted(common))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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
