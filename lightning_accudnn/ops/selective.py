"""Selective recomputation: keep what the expensive ops write, run the cheap ops again.

A segment recomputed selectively runs under PyTorch's selective activation checkpointing
(``torch.utils.checkpoint.create_selective_checkpoint_contexts``) with a per-op policy: the
outputs of :data:`~lightning_accudnn.profile.SELECTIVE_KEPT_OPS` (matrix products,
convolutions, attention kernels) are saved (``MUST_SAVE``), every other op is recomputed
(``PREFER_RECOMPUTE``). Where checkpointing can, what it keeps passes through the saved-tensor
hooks in force, so the offload engine sees and counts it.

:class:`SelectiveRecorder` measures, in a profiling pass, what that would keep per segment and
how much of the segment's forward time the recomputed ops take.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from lightning_accudnn.ops._torch_internals import StorageWeakReference, TorchDispatchMode, written_arguments
from lightning_accudnn.profile import SELECTIVE_KEPT_OPS

__all__ = ["SelectiveRecorder", "kept_by_selective", "selective_contexts", "selective_policy"]

_KEPT_PACKETS = frozenset(
    getattr(torch.ops.aten, name) for name in SELECTIVE_KEPT_OPS if hasattr(torch.ops.aten, name)
)


def kept_by_selective(func: object) -> bool:
    """Whether selective recomputation keeps the output of ``func`` (an ATen op overload).

    Example:
        >>> kept_by_selective(torch.ops.aten.mm.default), kept_by_selective(torch.ops.aten.relu.default)
        (True, False)
    """
    return isinstance(func, torch._ops.OpOverload) and func.overloadpacket in _KEPT_PACKETS


def selective_policy(ctx: object, func: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    """The per-op policy: ``MUST_SAVE`` the expensive ops' outputs, ``PREFER_RECOMPUTE`` the rest.

    Example:
        >>> selective_policy(None, torch.ops.aten.addmm.default).name
        'MUST_SAVE'
    """
    return CheckpointPolicy.MUST_SAVE if kept_by_selective(func) else CheckpointPolicy.PREFER_RECOMPUTE


class _Both:
    """Enter ``first`` then ``second``; leave in reverse order (one recompute context of two)."""

    __slots__ = ("first", "second")

    def __init__(
        self, first: contextlib.AbstractContextManager[Any], second: contextlib.AbstractContextManager[Any]
    ) -> None:
        self.first, self.second = first, second

    def __enter__(self) -> None:
        self.first.__enter__()
        try:
            self.second.__enter__()
        except BaseException:
            self.first.__exit__(None, None, None)
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.second.__exit__(*exc_info)
        finally:
            self.first.__exit__(*exc_info)


def selective_contexts(
    recomputation: contextlib.AbstractContextManager[Any],
) -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
    """``checkpoint``'s ``context_fn`` result for a selective segment: the caching mode in
    forward; ``recomputation`` (entered first) and the cached mode around each recomputation.

    Example:
        >>> from torch.utils.checkpoint import checkpoint
        >>> x = torch.randn(3, 3, requires_grad=True)
        >>> y = checkpoint(lambda t: (t @ t).relu(), x, use_reentrant=False,
        ...                context_fn=lambda: selective_contexts(contextlib.nullcontext()))
        >>> y.sum().backward(); x.grad.shape
        torch.Size([3, 3])
    """
    forward, recompute = create_selective_checkpoint_contexts(selective_policy)  # type: ignore[no-untyped-call]
    return forward, _Both(recomputation, recompute)


class SelectiveRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sees every ATen op of a forward pass and charges it to the segments open around it: the
    distinct storages the kept ops write (less each segment's inputs) and the time of the ops
    that a selective recomputation would run again, against the time of all.

    The owner says which segments are open (:meth:`open`, :meth:`close`) and which tensors
    autograd saves (:meth:`saved`): those neither kept nor inputs (nor ``excluded``, the
    model's parameters and buffers) are what a selective recomputation rebuilds in backward
    (:attr:`recomputed_bytes`). A segment whose kept output is written in place later in the
    forward (an in-place activation or dropout after a linear layer) would replay on the
    written values: it is listed in :attr:`unsafe`, with why. Each op is timed (the device
    synchronised around it on CUDA): use it in profiling passes only.

    Example:
        >>> recorder = SelectiveRecorder()
        >>> x = torch.randn(8, 8)
        >>> with recorder:
        ...     recorder.open("block", inputs={x.untyped_storage().data_ptr()})
        ...     y = torch.relu(x @ x)
        ...     recorder.close("block")
        >>> recorder.kept_bytes["block"], 0.0 < recorder.recompute_share("block") < 1.0
        (256, True)
    """

    def __init__(self, excluded: frozenset[int] = frozenset()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.kept_bytes: dict[str, int] = {}
        self.recomputed_bytes: dict[str, int] = {}
        self._excluded = excluded
        self.unsafe: dict[str, str] = {}
        self._kept_by: dict[int, list[str]] = {}  # kept storage -> the segments that keep it
        self._kept: dict[str, dict[int, StorageWeakReference]] = {}
        self._saved: dict[str, dict[int, StorageWeakReference]] = {}
        self._inputs: dict[str, set[int]] = {}
        self._seconds: dict[str, list[float]] = {}  # name -> [recomputed ops, all ops]
        self._open: list[str] = []

    def open(self, name: str, inputs: set[int]) -> None:
        """Segment ``name`` starts (``inputs``: its inputs' storage addresses)."""
        self._open.append(name)
        self._inputs[name] = inputs
        self._kept.setdefault(name, {})
        self._saved.setdefault(name, {})
        self.kept_bytes.setdefault(name, 0)
        self.recomputed_bytes.setdefault(name, 0)
        self._seconds.setdefault(name, [0.0, 0.0])

    def close(self, name: str) -> None:
        """Segment ``name`` returned (it and the segments opened inside it are closed)."""
        if name in self._open:
            del self._open[self._open.index(name) :]

    def saved(self, tensor: torch.Tensor) -> None:
        """Autograd saves ``tensor`` now (inside the segments open)."""
        if not self._open:
            return
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in self._excluded:
            return
        for name in self._open:
            if address in self._inputs[name] or _alive(self._kept[name], address):
                continue
            known = self._saved[name]
            if _alive(known, address):
                continue
            known[address] = StorageWeakReference(storage)
            self.recomputed_bytes[name] += storage.nbytes()

    def recompute_share(self, name: str) -> float:
        """The share of ``name``'s forward op time taken by the ops it would run again."""
        recomputed, total = self._seconds.get(name, (0.0, 0.0))
        return min(1.0, recomputed / total) if total > 0 else 1.0

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        written = written_arguments(func)
        if written and self._kept_by:
            self._check_writes(func, written, args, kwargs)
        if not self._open:
            return func(*args, **kwargs)
        synchronize = _synchronizer(args)
        synchronize()
        started = time.perf_counter()
        out = func(*args, **kwargs)
        synchronize()
        seconds = time.perf_counter() - started
        kept = kept_by_selective(func)
        outputs = _tensors(out) if kept else ()
        for name in self._open:
            totals = self._seconds[name]
            totals[1] += seconds
            if not kept:
                totals[0] += seconds
                continue
            known, inputs = self._kept[name], self._inputs[name]
            for tensor in outputs:
                storage = tensor.untyped_storage()
                address = storage.data_ptr()
                if address in inputs:
                    continue
                if _alive(known, address):
                    continue  # the same storage again
                known[address] = StorageWeakReference(storage)
                self.kept_bytes[name] += storage.nbytes()
                self._kept_by.setdefault(address, []).append(name)
        return out

    def _check_writes(
        self,
        func: object,
        written: tuple[tuple[int, str], ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        for position, argument in written:
            value = args[position] if position < len(args) else kwargs.get(argument)
            if not isinstance(value, torch.Tensor):
                continue
            address = value.untyped_storage().data_ptr()
            for name in self._kept_by.get(address, ()):
                if name not in self.unsafe and _alive(self._kept[name], address):
                    self.unsafe[name] = (
                        f"{func} writes in place into an output that recomputing it selectively keeps "
                        f"(shape {tuple(value.shape)})"
                    )


def _alive(known: dict[int, StorageWeakReference], address: int) -> bool:
    reference = known.get(address)
    return reference is not None and not reference.expired()


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _synchronizer(args: tuple[Any, ...]) -> Callable[[], None]:
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.is_cuda:
            device = arg.device
            return lambda: torch.cuda.synchronize(device)
    return _nothing


def _nothing() -> None:
    return None
