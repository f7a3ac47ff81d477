"""What a hooked pass holds on the device beyond the engine's ledger, layer by layer.

The ledger counts model state and saved activations. A step also holds memory no layer saves:
an op's output before the next op saves it (or if none does), a loss's float32 logits and their
gradient, the activations' gradients in backward, kernels' workspaces, and, between passes, the
optimizer's temporaries. :class:`WorkingMemoryMeter` measures it in a hooked pass by reading the
device allocator's peak (allocated bytes, since the previous reading) at every change of the
ledger: between two changes the ledger is constant, so the allocator's peak there less the
ledger is exactly what the ledger did not see then.

Each reading is charged to the planner's level it falls in (:mod:`lightning_accudnn.planner.timeline`),
so that a plan adds to each level what the step holds beyond it then, not the step's worst
anywhere:

* In forward, the level of layer ``f`` counts everything saved by the layers up to ``f`` (in the
  order of their first save), ``f`` being the last of them to have saved anything yet. A reading
  with ``u`` unseen bytes, taken when ``a`` bytes were saved so far, therefore holds
  ``u + a - (bytes the layers up to f save in the pass)`` beyond that level:
  :attr:`LayerProfile.forward_working_bytes` is the most of that.
* In backward, the level of layer ``f`` counts all of the saves of the layers up to ``f`` (those
  above are consumed). Readings go to the highest layer with a save autograd has not read yet:
  the layers above it are done, and its own saves are all still counted by the level (a
  layer is done at the first read of another layer's save after its last: the op that read its
  last save holds it until then). The engine lets a save go from its count when autograd reads
  it, while autograd's op still holds the tensor, so the bytes let go since that layer became the
  highest are taken off the unseen ones: :attr:`LayerProfile.backward_working_bytes` is the
  most of the rest (the lowest layer read so far would not do: a model's own code may save
  before its first layer and again for its loss, so that the layer of the loss's saves comes
  first in the order and is read first). Bytes let go from the prefetch window are not taken
  off: the engine fills that room again with the next copies at once, which the level counts
  in their place (:meth:`WorkingMemoryMeter.window_freed`).
* A swapped save's device tensor (a copy brought back, or the storage the copy-out FIFO left on
  the device) is held by no one but the op that reads it, where a plan that keeps the save has
  autograd hold it until the saving op's backward is done. The two can differ: a non-reentrant
  checkpoint reads the inputs it saved to recompute its segment, whose backward runs before
  the checkpoint's own, which then lets the kept inputs go. The meter holds such a tensor from
  its read until the layer's backward is over (:meth:`WorkingMemoryMeter.read`), as the level
  counts it: a copy dead early would leave the readings short of what a plan that keeps the
  layer holds, by its bytes (the ledger counts a copy until the engine finds it dead).
* A swapped storage the engine lets go in forward (its copy is out) is still allocated while
  the model's code holds it (a residual block's input until the addition). Until it dies it is
  taken off the unseen bytes of the forward's readings, as the level of a plan that keeps it
  counts it, and :attr:`LayerProfile.retired_alive_bytes` is the most of those at a forward
  level, which a plan that swaps adds there (up to what it swapped before that layer). The
  meter holds it meanwhile, and lets it go itself once the model's code has (at the next module
  boundary or reading), between two readings: freed in the allocator's own time, after a
  reading, its bytes would stay in the peak the next reading starts from (a peak is reset to
  what is allocated then), and that reading would take them for working memory (a loss's
  log-probabilities, let go once copied and freed before the forward ends, would be counted
  again beside the saves of a plan that keeps them).
* One still alive when the forward ends is held by the model's code beyond it (the batch):
  the engine keeps such storages on the device in the plans made from the pass
  (:data:`~lightning_accudnn.ops.layers.HELD`), so they are left out of
  :attr:`LayerProfile.retired_alive_bytes`, and in backward they are taken off the unseen
  bytes until the engine has read them (:meth:`WorkingMemoryMeter.held_read`), as the level of
  a plan that keeps them counts them until then.
* Between passes (the optimizer's step) the allocator's peak less model state is
  :attr:`WorkingMemory.outside_bytes` (never below 0).

A level's working memory may be negative: the ledger counts model state all step, and part of
it may not be allocated yet (the parameters' gradients, which a step that sets them to ``None``
makes in its backward: ResNet-152's 60.2 M parameters have 241 MB of float32 gradients). The
plan's level is then that much above what the step holds.

Example:
    >>> readings = iter([100, 180, 200, 250, 260])  # the allocator's peaks, reading after reading
    >>> layer = ["a"]
    >>> meter = WorkingMemoryMeter(lambda: next(readings), lambda: layer[0])
    >>> ledger = 100  # model state
    >>> meter.start(ledger)
    >>> meter.changing(ledger); meter.acquired(80); ledger += 80  # "a" saves its 80-byte output
    >>> meter.saved("a")
    >>> layer[0] = "b"
    >>> meter.changing(ledger); meter.acquired(20); ledger += 20  # "b" saves 20 bytes...
    >>> meter.saved("b")
    >>> meter.begin_backward(ledger, ["a", "b"])  # ... and held a 50-byte temporary after that
    >>> meter.read("b", ledger)
    >>> memory = meter.end(ledger, ["a", "b"])  # the loss's gradient: 60 bytes
    >>> memory.forward_bytes, memory.backward_bytes, memory.outside_bytes
    ({'a': 20, 'b': 50}, {'b': 60}, 0)

``a``'s 20 bytes are ``b``'s output before ``b`` saved it: then the last layer to have saved
was ``a``, whose level does not count ``b``'s saves.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

__all__ = ["WorkingMemory", "WorkingMemoryMeter"]


class _Expiring(Protocol):
    """A weak reference to a storage (the engine's ``StorageWeakReference``)."""

    def expired(self) -> bool: ...


class _Counted(_Expiring, Protocol):
    """A weak reference to a storage that also counts its strong references."""

    def use_count(self) -> int: ...


@dataclass(frozen=True)
class WorkingMemory:
    """What one hooked pass held beyond the planner's levels, per layer (by name; a layer
    missing holds nothing beyond them), and beyond model state before the pass; and, per
    layer's forward level, the most bytes of swapped storages the engine had let go that the
    model's code still held (:attr:`LayerProfile.retired_alive_bytes`).

    Example:
        >>> memory = WorkingMemory({"fc": 10}, {"fc": 30}, 5)
        >>> memory.forward_bytes.get("fc", 0), memory.backward_bytes.get("relu", 0)
        (10, 0)
    """

    forward_bytes: dict[str, int]
    backward_bytes: dict[str, int]
    outside_bytes: int
    retired_alive_bytes: dict[str, int] = field(default_factory=dict)
    #: Per layer of ``retired_alive_bytes``: the most of those bytes each layer's storages were
    #: (by the layer that saved them first), at any one reading of that level.
    retired_alive_from: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per layer of ``backward_bytes``: the most bytes of gradients not made yet while its
    #: readings were taken (empty when not counted).
    backward_gradients_to_come: dict[str, int] = field(default_factory=dict)
    #: The bytes of gradients not made yet when the pass began (0 when not counted).
    gradients_to_come_bytes: int = 0


class WorkingMemoryMeter:
    """Charges the allocator's readings to the planner's levels (see the module docstring).

    ``read_peak`` returns the allocator's peak of allocated bytes since its previous call;
    ``current_layer`` names the layer running now (the one a save in forward is attributed to).
    The engine calls :meth:`changing` before each change of its ledger (with the ledger's bytes
    then), :meth:`acquired` after a growth, :meth:`released` after a fall (and
    :meth:`window_freed` after one that freed room in the prefetch window), :meth:`allocating`
    before it allocates a block it is to count, :meth:`retired` after it let a swapped storage go
    in forward, :meth:`held_read` once it read one the model's code held beyond the forward for
    the last time, :meth:`saved` and :meth:`read` for each save autograd
    holds and reads, and :meth:`start`, :meth:`begin_backward`, :meth:`end` at the pass's steps.
    ``gradients_to_come`` (optional) returns the bytes of the parameters' gradients the backward
    has not made yet (:class:`~.gradient_arrivals.GradientArrivals`): the model state the ledger
    counts that the device does not hold then, which each backward level's working memory is
    net of (:attr:`WorkingMemory.backward_gradients_to_come`).

    Example:
        >>> meter = WorkingMemoryMeter(lambda: 0, lambda: "fc")
        >>> meter.start(0); meter.begin_backward(0, [])
        >>> memory = meter.end(0, [])
        >>> memory.forward_bytes, memory.backward_bytes, memory.outside_bytes, memory.retired_alive_bytes
        ({}, {}, 0, {})
    """

    def __init__(
        self,
        read_peak: Callable[[], int],
        current_layer: Callable[[], str],
        gradients_to_come: Callable[[], int] | None = None,
    ) -> None:
        self._read_peak = read_peak
        self._current_layer = current_layer
        self._gradients_to_come = gradients_to_come
        self._to_come = 0  # gradients not made yet at the last reading
        self._to_come_at_start = 0
        self._backward_to_come: dict[int, int] = {}  # per position: the most over its readings
        self._outside = 0
        self._order: list[str] = []  # layers in the order of their first save
        self._position: dict[str, int] = {}
        self._saved: list[int] = []  # per position: bytes its layer saved in forward
        self._saved_so_far = 0
        self._forward_top: dict[int, int] = {}  # per position: the most of unseen + saved so far
        self._backward_top: dict[int, int] = {}  # per position: the most unseen less let go
        self._in_backward = False
        self._unread: dict[str, int] = {}  # per layer: its saves autograd has not read yet
        self._profile_position: dict[str, int] = {}  # in backward: the profile's order
        self._layers: tuple[str, ...] = ()
        self._reading = -1  # in backward: the highest position with a save not read
        self._let_go = 0  # bytes the ledger let go since that position's backward began
        self._allocated_for_ledger = False  # see allocating()
        # swapped storages let go in forward, alive: bytes, storage, the layer that saved it first
        self._retired: list[tuple[int, _Expiring, str]] = []
        # every one let go in forward: bytes, token, layer
        self._retired_log: list[tuple[int, object, str]] = []
        # Per forward reading while some were alive: position, their bytes, how many were let go,
        # their bytes by layer.
        self._retired_readings: list[tuple[int, int, int, dict[str, int]]] = []
        self._retired_top: dict[int, int] | None = None  # per position: the most of them alive
        self._retired_top_from: dict[int, dict[str, int]] = {}  # per position and layer: the most
        self._held_unread = 0  # in backward: bytes held beyond the forward, not read yet
        self._held_copies: list[tuple[int, _Expiring]] = []  # read, their copies still alive
        self._ledger_now = 0  # the ledger's bytes, as its changes were told
        # In forward: retired storages held here (a reference each), to be let go between readings.
        self._holding: list[tuple[_Counted, object]] = []
        # In backward: the device tensors of the swapped saves read at the reading's position.
        self._read_copies: list[object] = []

    def start(self, ledger_bytes: int) -> None:
        """The pass starts, with ``ledger_bytes`` (model state) on the ledger: the allocator's
        peak since the last pass less those is the working memory between passes."""
        self._outside = max(0, self._read_peak() - ledger_bytes)
        self._ledger_now = ledger_bytes
        if self._gradients_to_come is not None:
            self._to_come_at_start = self._gradients_to_come()

    def changing(self, ledger_bytes: int) -> None:
        """The ledger, at ``ledger_bytes`` since the last change, is about to change."""
        self._ledger_now = ledger_bytes
        unseen = self._read_peak() - ledger_bytes
        if self._allocated_for_ledger:  # since the last reading: the block the ledger now counts
            self._allocated_for_ledger = False
            return
        if self._in_backward:
            if self._held_copies:
                self._settle_held_copies()
            position, tops = self._reading, self._backward_top
            level = unseen - self._let_go - self._held_unread
            if self._gradients_to_come is not None:
                # Gradients only arrive in backward: the most not made since the last reading
                # is what there was then.
                before, self._to_come = self._to_come, self._gradients_to_come()
                if before > self._backward_to_come.get(position, -1):
                    self._backward_to_come[position] = before
        else:
            position = len(self._order) - 1
            if self._retired:  # still alive now: alive since the last reading, and not working memory
                self._retired = [entry for entry in self._retired if not entry[1].expired()]
                alive = 0
                by_layer: dict[str, int] = {}
                for nbytes, _, layer in self._retired:
                    alive += nbytes
                    by_layer[layer] = by_layer.get(layer, 0) + nbytes
                unseen -= alive
                if alive:
                    self._retired_readings.append((position, alive, len(self._retired_log), by_layer))
            level, tops = unseen + self._saved_so_far, self._forward_top
        if level > tops.get(position, level - 1):
            tops[position] = level
        if self._holding:
            self._let_go_of_dropped()

    def acquired(self, nbytes: int) -> None:
        """The ledger grew by ``nbytes``: in forward, a save of the layer running now."""
        self._ledger_now += nbytes
        if self._in_backward:
            return
        layer = self._current_layer()
        position = self._position.get(layer)
        if position is None:
            position = self._position[layer] = len(self._order)
            self._order.append(layer)
            self._saved.append(0)
        self._saved[position] += nbytes
        self._saved_so_far += nbytes

    def allocating(self, ledger_bytes: int) -> None:
        """The engine is about to allocate a block its ledger counts at its next change (a copy
        brought back): the reading then holds that block, which is no working memory."""
        self.changing(ledger_bytes)
        self._allocated_for_ledger = True

    def retired(self, nbytes: int, storage: _Expiring, token: object = None, layer: str = "") -> None:
        """In forward the engine let go of ``nbytes`` of a swapped ``storage`` (its copy is out),
        which ``layer`` saved first: while the model's code still holds it, the planner's levels
        count it (as a plan that keeps it does) and :attr:`WorkingMemory.retired_alive_bytes`
        says how much of it there was, which a plan that swaps ``layer`` adds
        (:attr:`WorkingMemory.retired_alive_from`). ``token`` names it to :meth:`begin_backward`."""
        self._retired.append((nbytes, storage, layer))
        self._retired_log.append((nbytes, token, layer))

    def hold(self, storage: _Counted, held: object) -> None:
        """Keep ``held`` (the storage :meth:`retired` was just told of, which ``storage`` counts)
        alive until the model's code lets it go; then it is let go between two readings (see
        the module docstring)."""
        self._holding.append((storage, held))

    def boundary(self) -> None:
        """A module's forward starts or ends (or the forward does): a storage held here that the
        model's code no longer holds is let go now, after a reading."""
        if self._holding and not self._in_backward and any(ref.use_count() == 1 for ref, _ in self._holding):
            self.changing(self._ledger_now)

    def _let_go_of_dropped(self) -> None:
        """Let go of the storages held here alone; the allocator's peak then starts afresh."""
        holding = [entry for entry in self._holding if entry[0].use_count() > 1]
        if len(holding) < len(self._holding):
            self._holding = holding  # the others are freed here
            self._read_peak()  # since the reading just taken: nothing but those frees

    def held_read(self, nbytes: int, copy: _Expiring | None) -> None:
        """In backward the engine read for the last time ``nbytes`` of a storage the model's code
        held beyond the forward (see :meth:`begin_backward`), from the ``copy`` it brought back
        (``None``: none is left). A plan that keeps the storage lets it go from its level now,
        while the model's code holds it: the copy, until it dies, stands for it."""
        if copy is None:
            self._held_unread -= nbytes
        else:  # off the count at the first reading that finds it dead
            self._held_copies.append((nbytes, copy))

    def released(self, nbytes: int) -> None:
        """The ledger fell by ``nbytes``."""
        self._ledger_now -= nbytes
        if self._in_backward:
            self._let_go += nbytes

    def window_freed(self, nbytes: int) -> None:
        """The ``nbytes`` the ledger just let go were room in the prefetch window, which the
        engine may fill again at once with other copies brought back: the level counts those
        copies in their place, so these bytes are not taken off the unseen ones (while alive,
        they are working memory)."""
        if self._in_backward:
            self._let_go -= nbytes

    def saved(self, layer: str) -> None:
        """Autograd holds one more save of ``layer``'s, to be read in backward."""
        self._unread[layer] = self._unread.get(layer, 0) + 1

    def begin_backward(
        self,
        ledger_bytes: int,
        layers: Sequence[str],
        held: Collection[object] = (),
        held_bytes: int = 0,
    ) -> None:
        """The forward is over; ``layers`` are the profile's, in its order (of their first
        save). ``held`` names (by their :meth:`retired` tokens) the swapped storages the model's
        code holds beyond the forward, which plans keep: ``held_bytes`` of them, taken off the
        unseen bytes in backward until :meth:`held_read`, and left out of
        :attr:`WorkingMemory.retired_alive_bytes`."""
        self.changing(ledger_bytes)
        if self._gradients_to_come is not None:
            self._to_come = self._gradients_to_come()
        self._holding = []  # what the model's code holds beyond the forward stays alive
        self._settle_retired(held)
        self._in_backward = True
        self._held_unread = held_bytes
        self._retired = []  # the others alive are working memory in backward (as it is measured)
        self._profile_position = {layer: position for position, layer in enumerate(layers)}
        self._layers = tuple(layers)
        highest = self._highest_unread(len(layers) - 1)
        self._reading = len(layers) - 1 if highest is None else highest
        self._let_go = 0

    def read(
        self,
        layer: str,
        ledger_bytes: int,
        saved_again_by: tuple[str, int] | None = None,
        copy: object = None,
    ) -> None:
        """Autograd reads a save of ``layer`` (once per save). Once the highest layer with saves
        to read has none left, its backward is over at the next read of another layer's (the op
        that read its last save held it until then); later readings go to the next one down
        with saves to read (none left: they stay).

        ``copy`` is the device tensor of a swapped save read in backward, held here until the
        readings go to a layer further down (the module docstring says why). It is let go right
        after a reading: the engine, whose ledger counts a copy brought back until it finds it
        dead, is to look for the dead copies then.

        ``saved_again_by`` names, for a save of ``layer``'s storage made again by a later layer,
        that layer and the position it takes if it is not among the profile's layers (the next
        layer to save first after it): the op reading it is that layer's backward, so readings
        go to that layer's position, not below (nor up). A block's first convolution saves the
        block's input, the previous block's output: its backward (the gradient of that input,
        and of its weight) runs before the previous block's, and is charged to a level of its
        own block, not to the previous block's (a recomputed block's level holds its rebuilt
        saves on top)."""
        self.reaching(layer, ledger_bytes, saved_again_by)
        self._unread[layer] = self._unread.get(layer, 0) - 1
        if copy is not None and self._in_backward:
            self._read_copies.append(copy)

    def reaching(self, layer: str, ledger_bytes: int, saved_again_by: tuple[str, int] | None = None) -> None:
        """Autograd is about to read a save of ``layer`` (as :meth:`read`, which calls this too):
        if that ends the backward of the layer the readings go to, they go down now, and the
        copies held for it are let go. The engine calls it before it brings the save back (and
        prefetches others): the op that read that layer's saves is done, so a plan's level of
        the next layer holds its copies brought back, not those beside them, and neither would
        the step if the meter did not hold them (a copy is freed with the op that read it)."""
        reading = self._reading
        if (
            self._in_backward
            and reading >= 0
            and self._unread.get(self._layers[reading], 0) <= 0
            and self._profile_position.get(layer) != reading
        ):
            below = self._highest_unread(reading - 1)
            if saved_again_by is not None:  # that layer's backward: not above it, nor below
                position = self._profile_position.get(*saved_again_by)
                below = None if position >= reading else position if below is None else max(below, position)
            if below is not None:
                self.changing(ledger_bytes)
                self._reading = below
                self._let_go = 0
                if self._read_copies:
                    self._read_copies = []
                    self._read_peak()  # since the reading just taken: nothing but those frees

    def _settle_held_copies(self) -> None:
        """The held storages read whose copies died since the last reading: off the count."""
        alive = []
        for nbytes, copy in self._held_copies:
            if copy.expired():
                self._held_unread -= nbytes
            else:
                alive.append((nbytes, copy))
        self._held_copies = alive

    def _settle_retired(self, held: Collection[object]) -> None:
        """Per forward position, the most bytes of swapped storages let go and still alive that
        a plan swaps (``held`` left out: alive at every reading after they were let go)."""
        if self._retired_top is not None:
            return
        held_before = [0]
        held_entries = []  # (index in the log, layer, bytes) of those held
        for index, (nbytes, token, layer) in enumerate(self._retired_log):
            is_held = token is not None and token in held
            held_before.append(held_before[-1] + (nbytes if is_held else 0))
            if is_held:
                held_entries.append((index, layer, nbytes))
        tops: dict[int, int] = {}
        tops_from: dict[int, dict[str, int]] = {}
        for position, alive, count, by_layer in self._retired_readings:
            swapped = alive - held_before[count]
            if swapped > tops.get(position, 0):
                tops[position] = swapped
            own = dict(by_layer)
            for index, layer, nbytes in held_entries:
                if index < count and layer in own:
                    own[layer] -= nbytes
            _raise_to(tops_from.setdefault(position, {}), own)
        self._retired_top = tops
        self._retired_top_from = tops_from

    def _highest_unread(self, start: int) -> int | None:
        """The highest position at or below ``start`` whose layer has a save not read yet."""
        for position in range(start, -1, -1):
            if self._unread.get(self._layers[position], 0) > 0:
                return position
        return None

    def end(self, ledger_bytes: int, layers: Sequence[str]) -> WorkingMemory:
        """The pass is over: what the levels of ``layers`` (the profile's, in its order) held
        beyond them.

        A forward reading belongs to the level of the latest layer in that order among those
        that had saved: a layer's first save may be one of an earlier layer's storages (no
        growth of the ledger), so the order of first growths can differ."""
        self.changing(ledger_bytes)
        self._read_copies = []
        self._settle_retired(())
        assert self._retired_top is not None
        profile_position = {layer: position for position, layer in enumerate(layers)}
        saved_at = [0] * len(layers)
        for layer, nbytes in zip(self._order, self._saved, strict=True):
            if layer in profile_position:  # else a copy brought back in forward: no save
                saved_at[profile_position[layer]] += nbytes
        saved_up_to = list(accumulate(saved_at))
        forward: dict[str, int] = {}
        retired: dict[str, int] = {}
        retired_from: dict[str, dict[str, int]] = {}
        latest = 0
        for position, layer in enumerate(self._order):
            latest = max(latest, profile_position.get(layer, 0))
            alive = self._retired_top.get(position, 0)
            if alive and layers:
                retired[layers[latest]] = max(retired.get(layers[latest], 0), alive)
                _raise_to(
                    retired_from.setdefault(layers[latest], {}), self._retired_top_from.get(position, {})
                )
            top = self._forward_top.get(position)
            before = self._forward_top.get(-1) if position == 0 else None  # before the first save
            if before is not None:
                top = before if top is None else max(top, before)
            if top is not None and layers:
                name = layers[latest]
                beyond = top - saved_up_to[latest]
                forward[name] = beyond if name not in forward else max(forward[name], beyond)
        backward = {layers[position]: top for position, top in self._backward_top.items() if position >= 0}
        to_come = {
            layers[position]: most for position, most in self._backward_to_come.items() if position >= 0
        }
        return WorkingMemory(
            forward, backward, self._outside, retired, retired_from, to_come, self._to_come_at_start
        )


def _raise_to(most: dict[str, int], bytes_by_layer: Mapping[str, int]) -> None:
    """Raise each of ``most``'s counts to ``bytes_by_layer``'s where that is more."""
    for layer, nbytes in bytes_by_layer.items():
        if nbytes > most.get(layer, 0):
            most[layer] = nbytes
