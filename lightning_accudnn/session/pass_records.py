"""What the session keeps of each pass kind between its passes, for the steady state's hot path.

Per pass kind (:class:`~lightning_accudnn.session.plan_book.PassKey`): the save sequence its
last hooked pass recorded (replayed by ordinal, with no module hooks) and the segments it ran
recomputed, autocast's weight copies it counted, the host link's rates at its transfer sizes,
the passes since it was last observed whole, and the schedules and conclusions reused while
they hold (:class:`~lightning_accudnn.session.steady_memo.SteadyMemo`); and the model-state
bytes, walked again only when they may have changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from torch import nn

from lightning_accudnn.ops import StepStats, SwapSchedule
from lightning_accudnn.ops.layers import RecordName, SaveSequence
from lightning_accudnn.planner import Plan, StepProfile
from lightning_accudnn.profile import LayerProfile
from lightning_accudnn.profiling.bandwidth import HostLink, LinkCurve
from lightning_accudnn.profiling.static_memory import (
    model_state_bytes,
    optimizer_state_to_come_bytes,
    optimizer_step_temporaries_bytes,
)
from lightning_accudnn.session.plan_book import PassKey
from lightning_accudnn.session.shapes import same_pass_other_shape
from lightning_accudnn.session.steady_memo import SteadyMemo
from lightning_accudnn.session.transfers import transfer_sizes

__all__ = ["SMALLEST_COPY_OUT_LIMIT", "PassRecords", "with_storage_counts"]

#: The copy-out limit of the safest mode, which the profiling pass runs under: one storage in
#: flight at a time (the least memory any plan holds, as the planner's smallest budget assumes).
SMALLEST_COPY_OUT_LIMIT = 0


class PassRecords:
    """The session's memory of its pass kinds.

    Example:
        >>> records = PassRecords(torch.device("cpu"), min_swap_bytes=0, observe_every=2)
        >>> key = PassKey(model=1, batch=(), position=0)
        >>> records.hooked(key, plan=None, refining=False), records.sequence(key)
        (True, None)
        >>> [records.observation_due(key) for _ in range(4)]
        [False, True, False, True]
    """

    def __init__(self, device: torch.device, *, min_swap_bytes: int, observe_every: int) -> None:
        self.device = device
        self.min_swap_bytes = min_swap_bytes
        self.observe_every = observe_every
        self.steady = SteadyMemo()  # replayed passes: schedules and conclusions reused while they hold
        self._sequences: dict[PassKey, SaveSequence] = {}
        # Per model and position in the step (whatever the batch's shapes: a shape planned from
        # another's never profiles), the records (by layer and index, whatever the pass
        # recomputes) whose storages a pass found held beyond the forward (``HELD``): every later
        # schedule keeps them (:attr:`SwapSchedule.held_records`), for a pass that keeps one cannot
        # find it again.
        self._held: dict[tuple[int, int], frozenset[RecordName]] = {}
        self._recomputed: dict[PassKey, tuple[str, ...]] = {}  # the segments each sequence ran under
        self._weight_copy_bytes: dict[PassKey, int] = {}  # autocast's weight copies, per pass kind
        # The same per layer saving them, where autocast's cache went with the forward (see record).
        self._weight_copies_by_layer: dict[PassKey, dict[str, int]] = {}
        self._links: dict[PassKey, HostLink] = {}  # the link's rates at each pass kind's transfer sizes
        self._unobserved: dict[PassKey, int] = {}  # passes since the last observed one, per pass kind
        # Per pass kind, its profiling pass's static bytes and what it held at each forward level
        # beyond them and its ledger's saves (see note_swapped_pass).
        self._swapped_pass: dict[PassKey, tuple[int, dict[str, int]]] = {}
        self._state_bytes_key: tuple[object, ...] | None = None
        self._state_bytes = 0
        #: Of those, the optimizers' state not created yet (see :meth:`model_state_bytes`), and,
        #: while there is some, what their first step holds beside it.
        self.state_to_come_bytes = 0
        self.first_step_temporaries_bytes = 0

    def sequence(self, key: PassKey) -> SaveSequence | None:
        """The save sequence ``key``'s last hooked pass recorded (``None`` before one, or after
        its graph changed)."""
        return self._sequences.get(key)

    def hooked(self, key: PassKey, plan: Plan | None, *, refining: bool) -> bool:
        """Whether ``key``'s next pass under ``plan`` must run with the engine's module hooks: no
        plan, a plan to refine, no sequence recorded, or one recorded under other recomputed segments."""
        return (
            plan is None
            or refining
            or key not in self._sequences
            or self._recomputed.get(key) != plan.recomputed
        )

    def ran_under(self, key: PassKey, recomputed: tuple[str, ...]) -> bool:
        """Whether ``key``'s sequence was recorded with ``recomputed`` segments recomputed."""
        return self._recomputed.get(key) == recomputed

    def schedule(self, key: PassKey, plan: Plan | None) -> SwapSchedule:
        """The engine's schedule for ``key`` under ``plan``; without one, the profiling pass's:
        everything swapped within the host cap (what does not fit stays, and is still measured)."""
        if plan is None:
            return SwapSchedule.swap_everything(
                max_copying_out_bytes=SMALLEST_COPY_OUT_LIMIT, keep_beyond_host_limit=True
            )
        return self.steady.schedule(key, plan, self._held.get((key.model, key.position)))

    def observation_due(self, key: PassKey) -> bool:
        """Whether this replayed pass of ``key`` must pass the engine's hooks to its end: one in
        ``observe_every`` is, so that a changed graph shows within that many passes (the others
        pass them up to their plan's last swapped save, or not at all when it keeps everything)."""
        count = self._unobserved.get(key, 0) + 1
        due = count >= self.observe_every
        self._unobserved[key] = 0 if due else count
        return due

    def model_state_bytes(
        self, model: nn.Module, optimizers: tuple[torch.optim.Optimizer, ...], *, refresh: bool
    ) -> int:
        """:func:`~lightning_accudnn.profiling.static_memory.model_state_bytes`, walked again only
        when ``refresh`` (hooked passes) or when the model, the optimizers or their number of
        states changed (the first optimizer step creates them); :attr:`state_to_come_bytes` is
        the part of it the optimizers have not created yet, and
        :attr:`first_step_temporaries_bytes` what their first step holds beside it
        (:func:`~lightning_accudnn.profiling.static_memory.optimizer_step_temporaries_bytes`)."""
        key = (id(model), *(id(optimizer) for optimizer in optimizers), *(len(o.state) for o in optimizers))
        if refresh or key != self._state_bytes_key:
            self._state_bytes = model_state_bytes(model, optimizers)
            self.state_to_come_bytes = optimizer_state_to_come_bytes(optimizers)
            self.first_step_temporaries_bytes = (
                optimizer_step_temporaries_bytes(optimizers) if self.state_to_come_bytes else 0
            )
            self._state_bytes_key = key
        return self._state_bytes

    def weight_copy_bytes(self, key: PassKey) -> int:
        """Autocast's weight copies ``key``'s last hooked pass counted (model state, never swapped).

        A batch shape no pass counted yet holds those of the other shapes of its pass (the same
        weights cast, whatever the batch: the most any of them counted). A plan made for another
        shape, run for it, counts them in its static memory and not in its working memory
        (:meth:`~lightning_accudnn.profile.StepProfile.rebased`): without them its prediction
        would be short of them.

        Example:
            >>> records = PassRecords(torch.device("cpu"), min_swap_bytes=0, observe_every=2)
            >>> long, short = (PassKey(1, (((8, size), torch.int64),), 0) for size in (64, 32))
            >>> records._weight_copy_bytes[long] = 2_048
            >>> records.weight_copy_bytes(short), records.weight_copy_bytes(PassKey(2, (), 0))
            (2048, 0)
        """
        copies = self._weight_copy_bytes.get(key)
        if copies is not None:
            return copies
        counted = self._weight_copy_bytes.items()
        return max((nbytes for other, nbytes in counted if same_pass_other_shape(other, key)), default=0)

    def weight_copies_by_layer(self, key: PassKey) -> Mapping[str, int]:
        """:meth:`weight_copy_bytes` per layer saving them, for ``key``'s last hooked pass whose
        forward ended outside autocast (its cache then goes with the forward, and a recomputed
        layer's copies with it); empty otherwise."""
        return self._weight_copies_by_layer.get(key, {})

    def record(
        self,
        key: PassKey,
        step: StepStats,
        plan: Plan | None,
        copies_by_layer: Mapping[str, int],
        ledger_static: int,
    ) -> int:
        """Keep what ``key``'s pass (``step``, under ``plan``) recorded; returns its static bytes.

        Autocast's weight copies (kept, never swapped) are model state: a hooked pass's own
        count (``copies_by_layer``, per layer saving them) replaces the one its static bytes
        (``ledger_static``) started from; a replayed pass leaves them to autograd unlooked-at, as
        its profiled pass found them: that count stands. A pass that recomputed segments saw none
        of their layers' copies, which autocast made all the same (its cache holds them to the
        forward's end, and the recomputation makes them again): the larger count stands, per
        layer. The count per layer is kept only while autocast's cache went with the forward
        (see :meth:`weight_copies_by_layer`)."""
        copies = sum(copies_by_layer.values())
        if plan is not None and plan.recomputed:
            copies = max(copies, self.weight_copy_bytes(key))
            known = self._weight_copies_by_layer.get(key, {})
            copies_by_layer = {
                layer: max(known.get(layer, 0), copies_by_layer.get(layer, 0))
                for layer in {*known, *copies_by_layer}
            }
        if step.sequence is not None:
            self._weight_copies_by_layer[key] = (
                {} if step.autocast_past_forward else {k: v for k, v in copies_by_layer.items() if v}
            )
            self._sequences[key] = step.sequence
            self._recomputed[key] = () if plan is None else plan.recomputed
            held = (key.model, key.position)
            self._held[held] = self._held.get(held, frozenset()) | step.sequence.held_records()
            self._links.pop(key, None)
        else:
            copies = self.weight_copy_bytes(key)
        static_bytes = ledger_static - self.weight_copy_bytes(key) + copies
        self._weight_copy_bytes[key] = copies
        return static_bytes

    def forget_sequence(self, key: PassKey) -> None:
        """``key``'s graph departed from its sequence: its next pass runs hooked."""
        self._sequences.pop(key, None)
        self._swapped_pass.pop(key, None)

    def note_swapped_pass(self, key: PassKey, step: StepStats, profile: StepProfile) -> None:
        """Keep what ``key``'s profiling pass (``step``, made into ``profile``) held at each
        layer's forward level beyond its ledger: its working memory and the swapped storages the
        model's code still held (nothing when it measured none, or kept swappable bytes on the
        device for want of host memory: its ledger then held more than the bound counts)."""
        if not profile.layers_have_working_bytes or step.bytes_swapped_out < profile.swappable_bytes:
            self._swapped_pass.pop(key, None)
            return
        held = {
            layer.name: layer.forward_working_bytes + layer.retired_alive_bytes for layer in profile.layers
        }
        self._swapped_pass[key] = (profile.static_bytes, held)

    def with_swapped_pass(self, key: PassKey, profile: StepProfile) -> StepProfile:
        """``profile`` (``key``'s, to plan from) listing what ``key``'s profiling pass held
        (:meth:`note_swapped_pass`) beyond its static bytes as it counts them now
        (:attr:`~lightning_accudnn.profile.StepProfile.swapped_pass_forward_bytes`); as it is when
        none was kept or it lists no working memory."""
        kept = self._swapped_pass.get(key)
        if kept is None or not profile.layers_have_working_bytes:
            return profile
        static_bytes, held = kept
        moved = profile.static_bytes - static_bytes
        listed = tuple(
            (layer.name, held[layer.name] - moved) for layer in profile.layers if layer.name in held
        )
        return replace(profile, swapped_pass_forward_bytes=listed)

    def _copies_counted(self, key: PassKey, static_bytes: int, ledger_static: int) -> int:
        """Autocast's weight copies a ledger of ``ledger_static`` static bytes counted, where
        ``key``'s last pass made that ``static_bytes`` (:meth:`record`)."""
        return max(0, ledger_static - static_bytes + self.weight_copy_bytes(key))

    def link(self, key: PassKey) -> HostLink | None:
        """The host link's rates at ``key``'s transfer sizes, once a profile was made for it."""
        return self._links.get(key)

    def profile_from(
        self,
        step: StepStats,
        key: PassKey,
        static_bytes: int,
        probe: Callable[[torch.device], LinkCurve],
        *,
        measured_against: int,
        not_allocated: int = 0,
    ) -> StepProfile:
        """``key``'s pass as a profile of ``static_bytes`` of static memory, with the host link's
        rates at the sizes of its swappable storages (``probe``: the device's link, measured once
        per process).

        The pass measured its working memory (the allocator's bytes beyond its ledger) against a
        ledger of ``measured_against`` static bytes, ``not_allocated`` of which the allocator did
        not hold yet (the optimizers' state before their first step, held in every pass after):
        that much is added back to the working memory. A pass that first finds autocast's weight
        copies counted them as working memory, which the static memory holds from then on
        (:meth:`~lightning_accudnn.profile.StepProfile.rebased`). Where the pass measured working
        memory, the gradients not made yet when it began (the engine's
        :attr:`~lightning_accudnn.ops.StepStats.gradients_to_come_bytes`) and the weight copies
        the ledger counted are the static memory it did not hold at every level
        (:attr:`~lightning_accudnn.profile.StepProfile.static_not_held_bytes`)."""
        link = self._links.get(key)
        sequence = self._sequences.get(key)
        if link is None:
            sizes = transfer_sizes(sequence, self.min_swap_bytes)
            link = self._links[key] = probe(self.device).link_for(sizes)
        order = () if sequence is None else sequence.prefetch_order()
        measured = StepProfile(
            layers=with_storage_counts(step.layers, order),
            static_bytes=measured_against,
            d2h_bytes_per_second=link.d2h_bytes_per_second,
            h2d_bytes_per_second=link.h2d_bytes_per_second,
            resaves_listed=True,  # the engine lists every re-save of a swappable storage
            outside_working_bytes=step.outside_working_bytes,
            prefetch_order=order,
        )
        if measured.has_working_bytes:
            # The engine counted the gradients it had not made yet at each backward level.
            counted_copies = self._copies_counted(key, static_bytes, measured_against)
            measured = replace(measured, static_not_held_bytes=step.gradients_to_come_bytes)
            measured = measured.with_static_not_held_added(counted_copies)
        profile = measured.with_working_bytes_added(not_allocated).rebased(static_bytes)
        copies = self.weight_copies_by_layer(key)
        if not copies:
            return profile
        layers = tuple(
            replace(layer, weight_copy_bytes=copies[layer.name]) if layer.name in copies else layer
            for layer in profile.layers
        )
        return replace(profile, layers=layers)


def with_storage_counts(
    layers: tuple[LayerProfile, ...], prefetch_order: tuple[tuple[str, int, int], ...]
) -> tuple[LayerProfile, ...]:
    """``layers`` with their :attr:`~lightning_accudnn.profile.LayerProfile.swappable_storages`:
    the swappable records each opened, from the pass's ``prefetch_order`` (one entry per record).

    Example:
        >>> layers = (LayerProfile("norm", 48, 48), LayerProfile("relu", 32, 32))
        >>> order = (("relu", 32, 32), ("norm", 32, 32), ("norm", 8, 8), ("norm", 8, 8))
        >>> [layer.swappable_storages for layer in with_storage_counts(layers, order)]
        [3, 1]
    """
    counts = Counter(layer for layer, _, _ in prefetch_order)
    return tuple(
        replace(layer, swappable_storages=counts[layer.name])
        if counts[layer.name] != layer.swappable_storages
        else layer
        for layer in layers
    )
