"""Which layer is running now: module hooks that name each layer invocation.

A *layer* is one call of a module, named by its qualified name in the model. A module
called several times in one forward (torchvision's ``Bottleneck.relu`` is called three
times) gives ``"layer1.0.relu"``, ``"layer1.0.relu#2"``, ``"layer1.0.relu#3"``. Work done
outside every submodule (the loss in ``training_step``) belongs to :data:`ROOT_LAYER`; when that
code saves between submodules too (a functional ``F.relu`` between two layers, then the loss),
each stretch of it that saves after a submodule ran is a layer of its own, ``"(root)#2"`` and
on, so that its saves are ordered where they happen (a plan brings the loss's back first).
The innermost running module owns the tensors saved while it runs. A compiled block
(regional ``torch.compile``) is one layer: it is observed from outside its compiled region
and the modules inside it are not hooked (see :mod:`.compiled_blocks`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from lightning_accudnn.ops.compiled_blocks import (
    CallWrapHandle,
    compiled_in_place,
    modules_outside_compiled_code,
    wrap_compiled_call,
)
from lightning_accudnn.profile import ROOT_LAYER

#: What a save did in the profiled pass (:attr:`SaveSequence.kinds`): reused an earlier record,
REUSED = 0
#: opened a swappable record,
SWAPPABLE = 1
#: opened a record kept only for being below ``min_swap_bytes``,
SMALL = 2
#: or opened a record that may not move (excluded, ``keep_on_device``, empty);
PINNED = 3
#: or was no activation (a parameter, a tensor subclass, another device: left to autograd);
FILTERED = 4
#: or opened a record of a storage the model's code holds beyond the forward (the batch): a
#: swap of it frees nothing, so it stays on the device (:attr:`.SwapSchedule.held_records`).
HELD = 5

#: A record named the same way in every hooked pass of a graph, whatever the pass recomputes:
#: its layer and its index among the records that layer opens (in save order).
RecordName = tuple[str, int]


@dataclass
class _Frame:
    layer: str
    excluded: bool


@dataclass
class LayerTracker:
    """Names the layer invocation running now, through forward pre/post hooks.

    ``exclude`` holds qualified-name patterns (``fnmatch``: ``"fc"``, ``"head.*"``); a layer
    under an excluded module reports ``excluded=True``. ``on_enter`` and ``on_exit`` are
    called with the layer name as each invocation starts and ends (for timing); a new stretch of
    the step's own code (see :meth:`saving_layer`) is entered, never exited.

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> tracker = LayerTracker()
        >>> with tracker.attached(model):
        ...     _ = model(torch.ones(1, 2))
        >>> tracker.order
        ['(root)', '0', '1']
    """

    exclude: Iterable[str] = ()
    on_enter: Callable[[str], None] | None = None
    on_exit: Callable[[str], None] | None = None
    order: list[str] = field(default_factory=list)
    _stack: list[_Frame] = field(default_factory=list)
    _calls: dict[str, int] = field(default_factory=dict)
    _handles: list[RemovableHandle | CallWrapHandle] = field(default_factory=list)
    _root_saved = False  # the root's stretch running now has saved (see saving_layer)

    def attach(self, model: nn.Module) -> None:
        """Hook every submodule of ``model`` that runs outside compiled code, and start a fresh forward.

        A compiled block is hooked at its boundary; the modules inside it are not."""
        self.detach()
        self.reset()
        patterns = tuple(self.exclude)
        for name, module, _ in modules_outside_compiled_code(model):
            if not name:
                continue
            excluded = any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
            enter, exit_ = self._make_enter(name, excluded), self._make_exit(name)
            if compiled_in_place(module):  # its own hooks run inside the compiled code: wrap the call
                self._handles.append(wrap_compiled_call(module, partial(_observed, enter, exit_, module)))
            else:
                self._handles.append(module.register_forward_pre_hook(enter))
                self._handles.append(module.register_forward_hook(exit_, always_call=True))

    def detach(self) -> None:
        """Remove every hook this tracker installed."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def attached(self, model: nn.Module) -> _Attached:
        """Context manager form of :meth:`attach` / :meth:`detach`."""
        return _Attached(self, model)

    def reset(self) -> None:
        """Forget the invocation counts and the order; the next layer seen is the first."""
        self._stack = [_Frame(ROOT_LAYER, excluded=False)]
        self._calls = {}
        self.order = [ROOT_LAYER]
        self._root_saved = False

    @property
    def current(self) -> str:
        return self._stack[-1].layer if self._stack else ROOT_LAYER

    def saving_layer(self) -> str:
        """:attr:`current`, for a save: the layer it is attributed to (a save of the step's own
        code makes a submodule that runs next start a new stretch of it, see the module
        docstring).

        Example:
            >>> import torch
            >>> class Model(nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.fc1, self.fc2 = nn.Linear(2, 2), nn.Linear(2, 2)
            ...     def forward(self, x):
            ...         return self.fc2(torch.relu(self.fc1(x)))
            >>> model, tracker, seen = Model(), LayerTracker(), []
            >>> hooks = torch.autograd.graph.saved_tensors_hooks(
            ...     lambda t: seen.append(tracker.saving_layer()) or t, lambda t: t)
            >>> with tracker.attached(model), hooks:
            ...     loss = (model(torch.ones(1, 2)) ** 2).sum()
            >>> list(dict.fromkeys(seen))
            ['fc1', '(root)', 'fc2', '(root)#2']
        """
        if len(self._stack) == 1:
            self._root_saved = True
        return self.current

    @property
    def excluded(self) -> bool:
        return bool(self._stack) and self._stack[-1].excluded

    def _make_enter(self, name: str, excluded: bool) -> Callable[..., None]:
        def enter(module: nn.Module, args: object) -> None:
            count = self._calls.get(name, 0) + 1
            self._calls[name] = count
            layer = name if count == 1 else f"{name}#{count}"
            parent_excluded = self._stack[-1].excluded if self._stack else False
            self._stack.append(_Frame(layer, excluded or parent_excluded))
            self.order.append(layer)
            if self.on_enter is not None:
                self.on_enter(layer)

        return enter

    def _make_exit(self, name: str) -> Callable[..., None]:
        def exit_(module: nn.Module, args: object, output: object) -> None:
            # Pop back to this module's frame; an exception inside a child may have left
            # frames behind (always_call=True runs this hook on the way out).
            while len(self._stack) > 1:
                frame = self._stack.pop()
                if frame.layer.split("#", 1)[0] == name:
                    if self.on_exit is not None:
                        self.on_exit(frame.layer)
                    break
            if len(self._stack) == 1 and self._root_saved:  # the step's own code goes on: a new stretch
                self._root_saved = False
                count = self._calls.get(ROOT_LAYER, 1) + 1
                self._calls[ROOT_LAYER] = count
                stretch = f"{ROOT_LAYER}#{count}"
                self._stack[0] = _Frame(stretch, excluded=False)
                self.order.append(stretch)
                if self.on_enter is not None:  # its time is its own (it is never exited)
                    self.on_enter(stretch)

        return exit_


def _observed(
    enter: Callable[..., None],
    exit_: Callable[..., None],
    module: nn.Module,
    call: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """A compiled block's call between its layer's ``enter`` and ``exit_`` (also on an exception)."""
    enter(module, ())
    try:
        return call(*args, **kwargs)
    finally:
        exit_(module, (), None)


@dataclass
class _Attached:
    tracker: LayerTracker
    model: nn.Module

    def __enter__(self) -> LayerTracker:
        self.tracker.attach(self.model)
        return self.tracker

    def __exit__(self, *exc: object) -> None:
        self.tracker.detach()


class SaveSequence:
    """Every tensor one profiled pass gave autograd's pack hook, in order: who saved it, its size.

    A pass run again with the same graph saves the same sequence, so in steady state a saved
    tensor is attributed by its ordinal (no module hooks), and the cheap check that the graph
    did not change is its size: ``tensor_bytes[i]`` (``tensor.nbytes``; -1 for a tensor
    that was no activation, ``kinds[i]`` :data:`FILTERED`), ``sizes[i]`` its storage's bytes.

    Beside the layer, each save notes what the profiled pass did with it, so that a replayed
    pass can keep what the plan keeps without a record per tensor (see :mod:`.replay`):
    ``groups[i]`` is the ordinal of the first save of the same storage in the step,
    ``record_bytes[i]`` the bytes of the record the save opened (``kinds[i]`` is
    :data:`REUSED` when it reused an earlier one), ``kinds[i]`` whether that record was
    swappable (:data:`SWAPPABLE`), kept for its size only (:data:`SMALL`), not allowed
    to move (:data:`PINNED`) or held by the model's code beyond the forward (:data:`HELD`), and
    ``record_of[i]`` the ordinal that opened the record used.

    Example:
        >>> sequence = SaveSequence()
        >>> sequence.append("fc1", False, 1024, tensor_bytes=1024)
        >>> sequence.append("fc2", False, 0, kind=FILTERED)
        >>> sequence.layers[1], len(sequence), sequence.groups[1], sequence.tensor_bytes
        ('fc2', 2, 1, [1024, -1])
    """

    __slots__ = (
        "layers",
        "excluded",
        "sizes",
        "tensor_bytes",
        "groups",
        "record_bytes",
        "kinds",
        "record_of",
    )

    def __init__(self) -> None:
        self.layers: list[str] = []
        self.excluded: list[bool] = []
        self.sizes: list[int] = []
        self.tensor_bytes: list[int] = []
        self.groups: list[int] = []
        self.record_bytes: list[int] = []
        self.kinds: list[int] = []
        self.record_of: list[int] = []

    def append(
        self,
        layer: str,
        excluded: bool,
        storage_nbytes: int,
        *,
        tensor_bytes: int = -1,
        group: int | None = None,
        record_bytes: int = 0,
        kind: int = PINNED,
        record_of: int | None = None,
    ) -> None:
        ordinal = len(self.sizes)
        self.layers.append(layer)
        self.excluded.append(excluded)
        self.sizes.append(storage_nbytes)
        self.tensor_bytes.append(tensor_bytes)
        self.groups.append(ordinal if group is None else group)
        self.record_bytes.append(record_bytes)
        self.kinds.append(kind)
        self.record_of.append(ordinal if record_of is None else record_of)

    def __len__(self) -> int:
        return len(self.sizes)

    def held_records(self) -> frozenset[RecordName]:
        """The :data:`RecordName` of each record opened :data:`HELD`.

        Example:
            >>> sequence = SaveSequence()
            >>> sequence.append("a", False, 64, kind=SWAPPABLE, record_bytes=64)
            >>> sequence.append("b", False, 64, kind=SWAPPABLE, record_bytes=64)
            >>> sequence.append("b", False, 0, kind=FILTERED)
            >>> sequence.append("b", False, 64, group=1, kind=REUSED, record_of=1)
            >>> sequence.append("b", False, 32, kind=HELD, record_bytes=32)
            >>> sequence.held_records()
            frozenset({('b', 1)})
        """
        opened: dict[str, int] = {}
        held = []
        for layer, kind in zip(self.layers, self.kinds, strict=True):
            if kind in (REUSED, FILTERED):
                continue
            index = opened.get(layer, 0)
            opened[layer] = index + 1
            if kind == HELD:
                held.append((layer, index))
        return frozenset(held)

    def prefetch_order(self) -> tuple[tuple[str, int, int], ...]:
        """The swappable records in the order the engine brings swapped ones back (by their last
        save, the latest first), each as (its layer, its bytes, the bytes it takes in the prefetch
        window at least): its bytes for the first record of its storage in that order, 0 for
        the others (a storage the copy-out FIFO left on the device enters the window once, with
        its whole bytes).

        Example:
            >>> sequence = SaveSequence()
            >>> sequence.append("a", False, 64, kind=SWAPPABLE, record_bytes=64)
            >>> sequence.append("b", False, 64, group=0, kind=SWAPPABLE, record_bytes=32)  # a's storage
            >>> sequence.append("c", False, 64, group=0, kind=REUSED, record_of=0)  # a's, saved again
            >>> sequence.prefetch_order()
            (('a', 64, 64), ('b', 32, 0))
        """
        last: dict[int, int] = {}
        for ordinal, opened in enumerate(self.record_of):
            if self.kinds[opened] == SWAPPABLE:
                last[opened] = ordinal
        order = []
        seen: set[int] = set()
        for opened in sorted(last, key=last.__getitem__, reverse=True):
            storage = self.groups[opened]
            nbytes = self.record_bytes[opened]
            order.append((self.layers[opened], nbytes, 0 if storage in seen else nbytes))
            seen.add(storage)
        return tuple(order)
