"""The least Python a non-reentrant checkpoint can run: a floor under ``torch.utils.checkpoint``'s, measured.

    python -m bench.overhead.lean_checkpoint [--depth 152] [--rounds 10] [--results-dir bench/results]

On ResNet-152's block structure at tiny sizes (:mod:`bench.overhead.recompute`), most of a
step that checkpoints every block is ``torch.utils.checkpoint``'s own Python per saved tensor
(its holders, weak-key dictionaries, ``no_grad`` blocks and ``torch._dynamo.disable`` wrappers
around its hooks), not the forward it runs again. How much of that is needed? The function
:func:`lean_checkpoint` here keeps only the core of the contract, on a ``saved_tensors_hooks``
pair, as a floor under the product's whole-segment checkpoint
(:mod:`lightning_accudnn.ops.lean_recompute`, which :mod:`bench.overhead.recompute` measures):

- in forward, the segment's inputs saved through the hooks in force (the product's own
  :func:`~lightning_accudnn.ops.lean_recompute.save_inputs`) and each save inside replaced by its index;
- at the first unpack, the forward run again from those inputs under the CPU RNG state of the
  call, with grad enabled, each save captured at its index (detached), stopped early once all
  are captured; each unpack hands its tensor over and forgets it.

It leaves out what a product path needs too: more than one backward of a graph (graph task ids),
autocast and device RNG states replayed, the determinism check (shapes, dtypes, devices),
nesting, BatchNorm's running statistics kept once (they are updated again, as by
``torch.utils.checkpoint``), errors. Its figures are a floor, not an alternative: the rows are
a plain step, every bottleneck block under ``torch.utils.checkpoint`` (non-reentrant) and under
:func:`lean_checkpoint`; the CPU time per step (the thread's, medians over interleaved rounds)
and the bytecodes per step. The floor's gradients are first checked bitwise equal to plain ones.

Example:
    >>> result = measure(depth=26, rounds=1, steps=1)
    >>> result["gradients_bitwise_plain"], result["rows"]["lean"]["bytecodes_per_step"] > 0
    (True, True)
"""

from __future__ import annotations

import argparse
import collections
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.environment import REPO_ROOT
from bench.overhead.bytecodes import count_opcodes
from bench.overhead.models import tiny_resnet152
from bench.overhead.recompute import Row
from bench.report import write_result
from lightning_accudnn.ops.lean_recompute import save_inputs, saved_inputs

ROWS = ("plain", "checkpoint", "lean")
LABEL = (
    "CPU figures (torch on 1 thread, a shared machine): the thread's CPU time per training step of "
    "ResNet-152's block structure at tiny sizes. The lean row is a floor (a minimal checkpoint that "
    "leaves out what a product path needs), not a product path. Not GPU figures."
)


class _Stop(Exception):
    """Raised from the recomputation's pack hook once every save is captured again."""


class _Frame:
    """One checkpointed call: how many tensors it saved, and their recomputed values."""

    __slots__ = ("function", "saver", "saves", "values", "left", "rng_state")

    def __init__(self, function: Callable[..., Any], rng_state: torch.Tensor) -> None:
        self.function = function
        self.rng_state = rng_state
        self.saver: torch.Tensor | None = None
        self.saves = 0
        self.values: list[torch.Tensor | None] | None = None
        self.left = 0

    def pack(self, tensor: torch.Tensor) -> int:
        index = self.saves
        self.saves = index + 1
        return index

    def unpack(self, index: int) -> torch.Tensor:
        values = self.values
        if values is None:
            values = self._recompute()
        value = values[index]
        values[index] = None
        self.left -= 1
        if not self.left:
            self.values = None
        assert value is not None
        return value

    def _recompute(self) -> list[torch.Tensor | None]:
        assert self.saver is not None
        inputs = saved_inputs(self.saver)
        saves = self.saves
        values: list[torch.Tensor | None] = [None] * saves
        self.values, self.left = values, saves
        captured = 0

        def capture(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal captured
            value = values[captured] = tensor.detach() if tensor.requires_grad else tensor
            captured += 1
            if captured == saves:
                raise _Stop
            return value  # not ``tensor``: a node's own output would hold that node, a cycle never freed

        state = torch.get_rng_state()
        torch.set_rng_state(self.rng_state)
        try:
            with torch.autograd.graph.saved_tensors_hooks(capture, _same), torch.enable_grad():
                self.function(*inputs)
        except _Stop:
            pass
        finally:
            torch.set_rng_state(state)
        return values


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def lean_checkpoint(function: Callable[..., Any], *tensors: torch.Tensor) -> Any:
    """``function(*tensors)``, its saves rebuilt by running it again in backward (see the module
    docstring for what it leaves out).

    Example:
        >>> x = torch.randn(3, requires_grad=True)
        >>> lean_checkpoint(lambda t: t.sin().exp(), x).sum().backward()
        >>> torch.equal(x.grad, (x.sin().exp() * x.cos()).detach())
        True
    """
    frame = _Frame(function, torch.get_rng_state())
    frame.saver = save_inputs(tensors)
    with torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
        return function(*tensors)


class LeanCheckpointed(nn.Module):
    """Runs ``block`` under :func:`lean_checkpoint`."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> Any:
        return lean_checkpoint(self.block, x)


def _lean_blocks(model: nn.Module, names: list[str]) -> None:
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LeanCheckpointed(parent.get_submodule(child)))


def measure(depth: int = 152, rounds: int = 10, steps: int = 4, counted_steps: int = 2) -> dict[str, Any]:
    """The three rows' CPU time and bytecodes per step, and whether the floor's gradients are plain's."""
    torch.set_num_threads(1)
    workload = tiny_resnet152(depth=depth)
    batch = workload.make_batch(0)
    rows: dict[str, Row] = {}
    for name in ROWS:
        row = rows[name] = Row("plain" if name == "lean" else name, workload, batch)
        if name == "lean":
            _lean_blocks(row.model, workload.blocks(row.model))
    gradients = {}
    for name, row in rows.items():
        workload.loss(row.model, batch).backward()
        gradients[name] = [parameter.grad.clone() for parameter in row.model.parameters()]
        row.optimizer.zero_grad()
    bitwise = all(
        torch.equal(a, b) for a, b in zip(gradients["plain"], gradients["lean"], strict=True)
    ) and all(torch.equal(a, b) for a, b in zip(gradients["plain"], gradients["checkpoint"], strict=True))
    times: dict[str, list[float]] = collections.defaultdict(list)
    for row in rows.values():
        row.timed_steps(2)
    for _ in range(rounds):
        for name, row in rows.items():
            times[name] += row.timed_steps(steps)
    plain = statistics.median(times["plain"])
    result_rows = {}
    for name, row in rows.items():
        counts, _ = count_opcodes(lambda row=row: row.steps(counted_steps))
        median = statistics.median(times[name])
        result_rows[name] = {
            "cpu_ms_per_step": median * 1e3,
            "over_plain": median / plain,
            "bytecodes_per_step": round(sum(counts.values()) / counted_steps),
        }
    return {
        "kind": "lean-checkpoint-floor",
        "label": LABEL,
        "model": {"workload": "tiny_resnet152", **workload.params},
        "rounds": rounds,
        "steps_per_round": steps,
        "gradients_bitwise_plain": bitwise,
        "rows": result_rows,
    }


def _markdown(record: dict[str, Any]) -> str:
    lines = [
        "# The least a non-reentrant checkpoint can cost (CPU)",
        "",
        record["label"],
        "",
        "| row | CPU ms/step | over plain | bytecodes/step |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in record["rows"].items():
        ms, ratio, bytecodes = row["cpu_ms_per_step"], row["over_plain"], row["bytecodes_per_step"]
        lines.append(f"| {name} | {ms:.2f} | {ratio:.2f} | {bytecodes} |")
    lines += [
        "",
        f"Gradients bitwise plain (lean and checkpoint rows): {record['gradients_bitwise_plain']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--depth", type=int, default=152)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--results-dir", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    record = measure(args.depth, args.rounds)
    markdown = _markdown(record)
    print(markdown)
    write_result(args.results_dir, torch.device("cpu"), "lean-checkpoint", record, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
