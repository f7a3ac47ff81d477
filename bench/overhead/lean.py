"""The least bookkeeping a swap of a whole storage can have: a floor under the engine's, measured.

    python -m bench.overhead.lean [--layers 333] [--rounds 40] [--results-dir bench/results]

The half-swapped target (1.6x the default step) leaves a swap little time. How much of the
engine's cost is its representation (a record, a device block and weak references per storage)
and how much is what any swap has to do? :class:`LeanSwaps` runs the engine's replayed
half-swapped pass of the deep narrow model (its first half swapped, with the planner's window
and copy-out limit of one layer: :meth:`~bench.overhead.engine_passes.EnginePasses.deep_narrow`
with ``tight=True``) through hooks that keep only the core of the engine's contract for the
storages it swaps whole, in lists indexed by swap rather than in objects:

- at each save, the checks of the engine's whole path (the tensor, its storage, its device);
- a layer's copies out as one group, into host buffers reserved per storage;
- the copy-out FIFO, retired past the schedule's limit;
- the ledger's count and peak;
- prefetch rounds in reverse order of save, through the schedule's window, each one group;
- at each unpack, the version checks;
- a copy brought back counted until it dies (the engine watches its storage, a weak reference
  to the tensor here).

It leaves out what the engine also does: stream order (none on the CPU), a step that aborts, a
graph retained or dropped, a backward inside the forward, a graph that changed (the lean hooks
raise), host buffers shared under a cap across steps, the layer figures a pass reports. Its
figures are a floor under the engine's, not an alternative to it. Like the engine's, its host
buffers and their typed views are made once and reused by every pass (:meth:`LeanSwaps.new_pass`):
both are measured in the steady state.

For the engine and for the lean hooks, it reports the Python bytecodes per swapped storage
(counted as :mod:`bench.overhead.bytecodes` counts them) and the µs per swapped storage (the
half-swapped pass less the pass that keeps everything, over interleaved passes): wall clock,
medians and fastest, and the median of the thread's CPU time, which leaves out the time the
thread waits for the CPU while other work on a shared machine runs (everything here runs on
the calling thread). The lean pass's gradients are first checked equal to plain autograd's.

Example:
    >>> result = measure(layers=4, rounds=2)
    >>> result["lean"]["bytecodes_per_swap"] < result["engine"]["bytecodes_per_swap"]
    True
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.overhead.bytecodes import count_opcodes
from bench.overhead.engine_passes import EnginePasses
from bench.report import write_result
from lightning_accudnn.ops.replay import SWAP_AGAIN, SWAP_WHOLE, ReplayRoute


class _Step:
    """One pass's state, a list entry per swapped storage (by the order of its first save)."""

    __slots__ = ("versions", "roots", "sources", "fetched", "pending", "next", "window_used", "window_full")

    def __init__(self, swaps: int) -> None:
        self.versions = [0] * swaps
        self.roots: list[weakref.ref[torch.Tensor] | None] = [None] * swaps
        self.sources: list[torch.Tensor | None] = [None] * swaps  # in the copy-out FIFO
        self.fetched: list[torch.Tensor | None] = [None] * swaps
        self.pending = [0] * swaps  # saves not unpacked yet
        self.next = swaps - 1  # the next swap to bring back
        self.window_used = 0
        self.window_full = False


class KeepHooks:
    """The baseline: hooks that count the saves by ordinal and keep every tensor.

    Example:
        >>> hooks = KeepHooks()
        >>> saved = torch.ones(2)
        >>> hooks.unpack(hooks.pack(saved)) is saved, hooks.calls
        (True, 1)
    """

    def __init__(self) -> None:
        self.calls = 0

    def pack(self, tensor: torch.Tensor) -> object:
        self.calls += 1
        return tensor

    @staticmethod
    def unpack(packed: object) -> object:
        return packed


class LeanSwaps(KeepHooks):
    """Hooks for one replayed pass of ``route``'s storages swapped whole (see the module docstring).

    Example:
        >>> passes = EnginePasses.deep_narrow(torch.device("cpu"), layers=2, tight=True)
        >>> lean = LeanSwaps(ReplayRoute(passes.profiles["half"].sequence, passes.schedules["half"]))
        >>> loss = run_pass(passes, lean)
        >>> lean.peak_bytes > 0 and lean.ledger_bytes == lean.held_at_end()
        True
    """

    def __init__(self, route: ReplayRoute) -> None:
        super().__init__()
        sequence, schedule = route.sequence, route.schedule
        self.actions, self.group_ends = route.actions, route.group_ends
        self.index: dict[int, int] = {}  # ordinal -> swap
        self.sizes: list[int] = []
        for ordinal, action in enumerate(self.actions):
            if action == SWAP_WHOLE:
                self.index[ordinal] = len(self.sizes)
                self.sizes.append(sequence.sizes[ordinal])
        for ordinal, action in enumerate(self.actions):
            if action == SWAP_AGAIN:
                self.index[ordinal] = self.index[sequence.record_of[ordinal]]
        self.window = schedule.prefetch_window_bytes
        self.limit = schedule.max_copying_out_bytes
        self.hosts = [torch.empty(nbytes, dtype=torch.uint8) for nbytes in self.sizes]
        self.host_views: list[torch.Tensor | None] = [None] * len(self.sizes)
        self.new_pass()

    def new_pass(self) -> LeanSwaps:
        """Ready for the next pass (the host buffers and their typed views kept, as the
        engine's pool keeps them across steps); returns ``self``."""
        self.calls = 0
        self.step = _Step(len(self.sizes))
        self.ledger_bytes = 0
        self.peak_bytes = 0
        self._group: tuple[list[torch.Tensor], list[torch.Tensor], list[int]] = ([], [], [])
        self._fifo: collections.deque[int] = collections.deque()
        self._fifo_bytes = 0
        self._lingering: list[tuple[weakref.ref[torch.Tensor], int]] = []
        return self

    def held_at_end(self) -> int:
        """Bytes still counted after the pass: the FIFO's last swaps and the copies not yet dead."""
        return sum(self.sizes[swap] for swap in self._fifo) + sum(n for _, n in self._lingering)

    def _count(self, nbytes: int) -> None:
        current = self.ledger_bytes = self.ledger_bytes + nbytes
        if current > self.peak_bytes:
            self.peak_bytes = current

    def pack(self, tensor: torch.Tensor) -> object:
        ordinal = self.calls
        self.calls = ordinal + 1
        action = self.actions[ordinal]
        if action == SWAP_WHOLE:
            swap = self.index[ordinal]
            nbytes = self.sizes[swap]
            storage = tensor.untyped_storage()
            if (
                type(tensor) is not torch.Tensor
                or tensor.layout != torch.strided
                or storage.nbytes() != nbytes
                or tensor.storage_offset()
                or not tensor.is_contiguous()
                or not tensor.is_cpu
            ):
                raise RuntimeError(f"save {ordinal} is not what was profiled")
            step = self.step
            view = self.host_views[swap]
            if view is None:
                view = self.host_views[swap] = self.hosts[swap].view(tensor.dtype).view(tensor.shape)
            version = step.versions[swap] = tensor._version
            base = tensor._base
            step.roots[swap] = weakref.ref(tensor if base is None else base)
            step.sources[swap] = tensor
            step.pending[swap] = 1
            self._count(nbytes)
            sources, hosts, swaps = self._group
            sources.append(tensor)
            hosts.append(view)
            swaps.append(swap)
            if self.group_ends[ordinal]:
                self._copy_out(step)
            return (step, swap, version)
        if action == SWAP_AGAIN:
            swap = self.index[ordinal]
            step = self.step
            base = tensor._base
            root = step.roots[swap]
            if root is None or root() is not (tensor if base is None else base):
                raise RuntimeError(f"save {ordinal} is not what was profiled")
            step.pending[swap] += 1
            return (step, swap, tensor._version)
        return tensor

    def _copy_out(self, step: _Step) -> None:
        sources, hosts, swaps = self._group
        with torch.no_grad():
            torch._foreach_copy_(hosts, sources)
        for swap in swaps:
            self._fifo.append(swap)
            self._fifo_bytes += self.sizes[swap]
        self._group = ([], [], [])
        limit = self.limit
        while limit is not None and self._fifo_bytes > limit and len(self._fifo) > 1:
            oldest = self._fifo.popleft()
            self._fifo_bytes -= self.sizes[oldest]
            step.sources[oldest] = None
            self.ledger_bytes -= self.sizes[oldest]

    def _prefetch(self, step: _Step) -> None:
        fetched, pending, sizes = step.fetched, step.pending, self.sizes
        swap = step.next
        step.window_full = False
        destinations: list[torch.Tensor] = []
        hosts: list[torch.Tensor] = []
        while swap >= 0:
            if fetched[swap] is None and pending[swap]:
                nbytes = sizes[swap]
                if step.window_used > 0 and step.window_used + nbytes > self.window:
                    step.window_full = True
                    break
                source = step.sources[swap]
                if source is not None:  # still in the FIFO: read where it is
                    fetched[swap] = source
                else:
                    view = self.host_views[swap]
                    assert view is not None
                    destination = torch.empty_strided(view.shape, view.stride(), dtype=view.dtype)
                    fetched[swap] = destination
                    destinations.append(destination)
                    hosts.append(view)
                    self._count(nbytes)
                    step.window_used += nbytes
            swap -= 1
        step.next = swap
        if destinations:
            torch._foreach_copy_(destinations, hosts)

    def unpack(self, packed: object) -> object:
        if type(packed) is not tuple:
            return packed
        step, swap, version = packed
        if self._lingering:
            alive = []
            for copy, nbytes in self._lingering:
                if copy() is None:
                    self.ledger_bytes -= nbytes
                    step.window_used -= nbytes
                    step.window_full = False
                else:
                    alive.append((copy, nbytes))
            self._lingering = alive
        if step.next >= 0 and not step.window_full:
            self._prefetch(step)
        root = step.roots[swap]
        alive_root = None if root is None else root()
        if version != step.versions[swap] or (alive_root is not None and alive_root._version != version):
            raise RuntimeError("a saved tensor was modified in place")
        tensor = step.fetched[swap]
        assert tensor is not None
        pending = step.pending[swap] = step.pending[swap] - 1
        if pending == 0:
            step.fetched[swap] = None
            if step.sources[swap] is None:  # a copy brought back: counted until it dies
                self._lingering.append((weakref.ref(tensor), self.sizes[swap]))
        return tensor


def run_pass(passes: EnginePasses, hooks: KeepHooks | None) -> torch.Tensor:
    """One forward and backward of ``passes``' model, through ``hooks`` (``None``: plain autograd)."""
    model, batch = passes.model, passes.batch
    if hooks is None:
        loss = model(batch).sum()
    else:
        with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
            loss = model(batch).sum()
    loss.backward()
    return loss


def _gradients(passes: EnginePasses, hooks: KeepHooks | None) -> list[torch.Tensor]:
    passes.model.zero_grad(set_to_none=True)
    run_pass(passes, hooks)
    return [parameter.grad.clone() for parameter in passes.model.parameters() if parameter.grad is not None]


def _bytecodes(run: Callable[[], object]) -> int:
    counts, _ = count_opcodes(run)
    return sum(counts.values())


def measure(layers: int = 333, rounds: int = 40) -> dict[str, Any]:
    """The engine's and the lean hooks' cost per swapped storage on the deep narrow model."""
    passes = EnginePasses.deep_narrow(torch.device("cpu"), layers=layers, tight=True)
    route = ReplayRoute(passes.profiles["half"].sequence, passes.schedules["half"])
    lean = LeanSwaps(route)  # measured in the steady state: its host buffers and views made once
    plain = _gradients(passes, None)
    for _ in range(2):  # its first pass, and one reusing its buffers
        swapped_pass = _gradients(passes, lean.new_pass())
        if len(swapped_pass) != len(plain) or not all(
            torch.equal(a, b) for a, b in zip(swapped_pass, plain, strict=True)
        ):
            raise AssertionError("the lean hooks' gradients differ from plain autograd's")
    swaps = len(lean.sizes)
    swapped = passes.run("half").storages_swapped_out
    variants: dict[str, Callable[[], object]] = {
        "engine keep": lambda: passes.run("keep"),
        "engine half": lambda: passes.run("half"),
        "lean keep": lambda: run_pass(passes, KeepHooks()),
        "lean half": lambda: run_pass(passes, lean.new_pass()),
    }
    bytecodes = {name: _bytecodes(run) for name, run in variants.items()}
    seconds: dict[str, list[float]] = {name: [] for name in variants}  # wall clock
    thread_seconds: dict[str, list[float]] = {name: [] for name in variants}  # this thread's CPU time
    for _ in range(rounds):
        for name, run in variants.items():
            start, thread_start = time.perf_counter(), time.thread_time()
            run()
            thread_seconds[name].append(time.thread_time() - thread_start)
            seconds[name].append(time.perf_counter() - start)

    def per_swap(kind: str, count: int) -> dict[str, float]:
        half, keep = seconds[f"{kind} half"], seconds[f"{kind} keep"]
        thread_half, thread_keep = thread_seconds[f"{kind} half"], thread_seconds[f"{kind} keep"]
        return {
            "bytecodes_per_swap": (bytecodes[f"{kind} half"] - bytecodes[f"{kind} keep"]) / count,
            "us_per_swap_median": (statistics.median(half) - statistics.median(keep)) * 1e6 / count,
            "us_per_swap_fastest": (min(half) - min(keep)) * 1e6 / count,
            "thread_us_per_swap_median": (statistics.median(thread_half) - statistics.median(thread_keep))
            * 1e6
            / count,
        }

    return {
        "layers": layers,
        "rounds": rounds,
        "swapped_storages": {"engine": swapped, "lean": swaps},
        "engine": per_swap("engine", swapped),
        "lean": per_swap("lean", swaps),
        "pass_ms_median": {name: statistics.median(values) * 1e3 for name, values in seconds.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=333)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved passes of each variant")
    parser.add_argument("--results-dir", type=Path, default=None, help="also write JSON under DIR/cpu/")
    parser.add_argument("--name", default="lean")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # every operation on the calling thread, whose CPU time is measured
    try:
        result = measure(args.layers, args.rounds)
    finally:
        torch.set_num_threads(threads)
    print(f"CPU, deep narrow model ({args.layers} layers), half swapped, window of one layer:")
    for kind in ("engine", "lean"):
        figures = result[kind]
        print(
            f"  {kind:6} {result['swapped_storages'][kind]} storages: {figures['bytecodes_per_swap']:.1f} "
            f"bytecodes, {figures['us_per_swap_median']:.1f} µs (median passes), "
            f"{figures['us_per_swap_fastest']:.1f} µs (fastest passes), "
            f"{figures['thread_us_per_swap_median']:.1f} µs of the thread's CPU time (median passes) "
            "per swapped storage"
        )
    if args.results_dir is not None:
        label = "CPU: wall-clock times of this CPU (a shared machine), and bytecodes; not GPU figures"
        record = {"kind": "bench.overhead.lean", "torch_threads": 1, "label": label, **result}
        write_result(args.results_dir, torch.device("cpu"), args.name, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
