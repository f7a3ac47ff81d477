"""What one rank brings to the ranks' agreement on plans, and what it takes from it.

The session records here, after each pass, the pass kind's latest measurement and what it
asks for (a re-plan, a larger reserve); at an agreement point (the coordinator's schedule, the
same pass on every rank) :meth:`PlanAgreement.agree` merges every rank's requests and profiles
through the coordinator and hands back what every rank then plans alike. One process agrees
with itself after every pass (:class:`~lightning_accudnn.session.coordination.RankCoordinator`);
:class:`~lightning_accudnn.session.DistributedCoordinator` runs the collectives.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from lightning_accudnn.planner.plan import Plan
from lightning_accudnn.planner.scaling import borrowed_measurements
from lightning_accudnn.profile import LayerProfile, StepProfile, most_bytes_by_name
from lightning_accudnn.session.coordination import RankCoordinator, ReplanRequest
from lightning_accudnn.session.plan_book import PassKey

__all__ = ["Agreed", "Measured", "PlanAgreement"]


@dataclass(frozen=True)
class Measured:
    """A pass kind's latest measurement: its profile, the plan whose times an untimed pass
    borrows, and whether it ran under a plan (a plan made from it is then refined).

    Example:
        >>> profile = StepProfile((LayerProfile("fc", 10, 10, 1e-3, 2e-3),), static_bytes=5)
        >>> Measured(profile, None, planned=False).profile_to_plan() is profile  # timed: its own
        True
    """

    profile: StepProfile
    times_of: Plan | None
    planned: bool

    def profile_to_plan(self) -> StepProfile:
        """The profile, with the times (and re-saves, and working memory) of ``times_of`` when
        the pass was untimed."""
        if self.times_of is None:
            return self.profile
        timed = self.times_of.profile
        return replace(
            self.profile,
            layers=with_times_of(self.profile.layers, timed),
            outside_working_bytes=max(self.profile.outside_working_bytes, timed.outside_working_bytes),
            static_not_held_bytes=max(self.profile.static_not_held_bytes, timed.static_not_held_bytes),
        )


@dataclass(frozen=True)
class Agreed:
    """What an agreement settled: the reserve this rank must add to end with as much as the
    rank that raised it most, the profile to plan each pass kind from, and the pass kinds whose
    re-plan only refines the plan in force (see :class:`ReplanRequest`).

    Example:
        >>> agreed = Agreed(catch_up_bytes=0, profiles={})  # nothing asked for
        >>> agreed.refine_only
        frozenset()
    """

    catch_up_bytes: int
    profiles: dict[PassKey, StepProfile]
    refine_only: frozenset[PassKey] = frozenset()


class PlanAgreement:
    """One rank's side of the agreement: its pending requests, each pass kind's latest
    measurement and its name on every rank (the models in the order this rank met them).

    Example:
        >>> import torch
        >>> from lightning_accudnn.profile import LayerProfile
        >>> agreement = PlanAgreement(RankCoordinator())
        >>> key = PassKey(model=1234, batch=(((8, 3), torch.float32),), position=0)
        >>> profile = StepProfile((LayerProfile("fc", 10, 10, 1e-3, 2e-3),), static_bytes=5)
        >>> agreement.record(key, Measured(profile, None, planned=False), ReplanRequest(replan=True))
        >>> agreement.due()
        True
        >>> agreed = agreement.agree()
        >>> agreed.catch_up_bytes, agreed.profiles[key] is profile
        (0, True)
    """

    def __init__(self, coordinator: RankCoordinator) -> None:
        self.coordinator = coordinator
        self._requests: dict[PassKey, ReplanRequest] = {}
        self._measured: dict[PassKey, Measured] = {}
        self._wire_keys: dict[PassKey, tuple[object, ...]] = {}
        self._model_ordinals: dict[int, int] = {}
        self._raised = 0  # reserve this rank added for overshoots since the last agreement

    def record(self, key: PassKey, measured: Measured, request: ReplanRequest) -> None:
        """Keep ``key``'s latest measurement and add ``request`` to what waits for the next agreement."""
        self._measured[key] = measured
        self._wire_keys.setdefault(key, (self._model_ordinal(key.model), key.batch, key.position))
        if request:
            self._requests[key] = self._requests.get(key, ReplanRequest()) | request

    def overshoot(self, nbytes: int) -> ReplanRequest:
        """This rank raised its reserve by ``nbytes``: the request carries all it raised since
        the last agreement, so that the agreement leaves every rank with as much."""
        self._raised += nbytes
        return ReplanRequest(replan=True, overshoot_bytes=self._raised)

    def measured(self, key: PassKey) -> Measured:
        """``key``'s latest measurement (recorded before any plan is made for it)."""
        return self._measured[key]

    def due(self) -> bool:
        """Called once per pass: whether the ranks agree after this one."""
        return self.coordinator.due()

    def agree(self) -> Agreed:
        """An agreement point: merge every rank's requests, and the profiles of the passes they name."""
        requests, self._requests = self._requests, {}
        raised, self._raised = self._raised, 0
        agreed = self.coordinator.agree({self._wire_keys[key]: request for key, request in requests.items()})
        if not agreed:
            return Agreed(0, {})
        catch_up = max(0, max(request.overshoot_bytes for request in agreed.values()) - raised)
        keys: dict[Hashable, PassKey] = {wire: key for key, wire in self._wire_keys.items() if wire in agreed}
        profiles = self.coordinator.merge(
            {wire: self._measured[key].profile_to_plan() for wire, key in keys.items()}
        )
        # A reserve grown on any rank: every pass kind planned now plans under it at once.
        grown = any(request.overshoot_bytes for request in agreed.values())
        refine_only = frozenset(keys[wire] for wire in profiles if agreed[wire].refine_only and not grown)
        return Agreed(catch_up, {keys[wire]: profile for wire, profile in profiles.items()}, refine_only)

    @contextmanager
    def alone(self) -> Iterator[None]:
        """Within the block this rank agrees with itself only (no collectives)."""
        coordinator, self.coordinator = self.coordinator, RankCoordinator()
        try:
            yield
        finally:
            self.coordinator = coordinator

    def _model_ordinal(self, model: int) -> int:
        """The model's number in the order this rank met it (the same on every rank)."""
        return self._model_ordinals.setdefault(model, len(self._model_ordinals))


def with_most_working_memory(profile: StepProfile, earlier: StepProfile) -> StepProfile:
    """``profile`` with, per layer (by name) and between passes, the most working memory it or
    ``earlier`` (the same pass kind's, from earlier passes) measured.

    Working memory is what the allocator held beyond the ledger; a pass may miss some that
    another met (a kernel's workspace that depends on what the allocator had free, the swapped
    storages the model's code still held, which the profiling pass, swapping all it can, meets
    most of). Plans made from the most of every pass measured count all of it. After the first
    pass of a batch shape planned from another's profile, ``earlier`` is that profile scaled: it
    carries what the other shape's passes met (its profiling pass's among them), which one pass
    under one plan cannot.

    Example:
        >>> earlier = StepProfile((LayerProfile("fc", 10, 10, forward_working_bytes=7),), 0)
        >>> now = StepProfile((LayerProfile("fc", 10, 10, backward_working_bytes=5),), 0)
        >>> layer = with_most_working_memory(now, earlier).layers[0]
        >>> layer.forward_working_bytes, layer.backward_working_bytes
        (7, 5)
    """
    if not earlier.has_working_bytes:
        return profile
    by_name = {layer.name: layer for layer in earlier.layers}
    layers = []
    for layer in profile.layers:
        known = by_name.get(layer.name)
        if known is None:
            layers.append(layer)
            continue
        not_held, known_not_held = (
            profile.backward_static_not_held(layer),
            earlier.backward_static_not_held(known),
        )
        if (
            known.forward_working_bytes > layer.forward_working_bytes
            or known.backward_working_bytes > layer.backward_working_bytes
            or known_not_held > not_held
        ):
            layer = replace(
                layer,
                forward_working_bytes=max(layer.forward_working_bytes, known.forward_working_bytes),
                backward_working_bytes=max(layer.backward_working_bytes, known.backward_working_bytes),
                backward_static_not_held_bytes=max(not_held, known_not_held),
            )
        if (
            known.retired_alive_bytes > layer.retired_alive_bytes
            or known.retired_alive_from != layer.retired_alive_from
        ):
            layer = replace(
                layer,
                retired_alive_bytes=max(layer.retired_alive_bytes, known.retired_alive_bytes),
                retired_alive_from=most_bytes_by_name(layer.retired_alive_from, known.retired_alive_from),
            )
        layers.append(layer)
    return replace(
        profile,
        layers=tuple(layers),
        outside_working_bytes=max(profile.outside_working_bytes, earlier.outside_working_bytes),
        static_not_held_bytes=max(profile.static_not_held_bytes, earlier.static_not_held_bytes),
    )


def with_times_of(layers: tuple[LayerProfile, ...], timed: StepProfile) -> tuple[LayerProfile, ...]:
    """The layers of an untimed pass with the times, the re-saves and the working memory an
    earlier, timed pass of it (``timed``) measured (a pass replayed by ordinal sees none of
    them), at the untimed pass's bytes
    (:func:`~lightning_accudnn.planner.scaling.borrowed_measurements`, with the timed pass's
    model state not held where it measured them).

    Example:
        >>> untimed = (LayerProfile("fc", 10, 10, 0.0, 0.0),)
        >>> timed = StepProfile((LayerProfile("fc", 10, 10, 1e-3, 2e-3),), 0)
        >>> with_times_of(untimed, timed)[0].backward_seconds
        0.002
    """
    by_name = {layer.name: layer for layer in timed.layers}
    return tuple(
        layer
        if layer.name not in by_name
        else borrowed_measurements(
            layer,
            by_name[layer.name],
            timed.static_not_held_bytes,
            timed.backward_static_not_held(by_name[layer.name]),
        )
        for layer in layers
    )
