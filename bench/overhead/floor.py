"""The floors: what a bare ``torch.autograd.graph.saved_tensors_hooks`` pair costs per saved
tensor, and what one that copies every saved tensor out and back costs.

A plain PyTorch loop (no Lightning, no strategy) trains the same model with and without a
pack/unpack pair around forward; the difference of the two step times, over the tensors
autograd saved, is the cost of the pair per saved tensor. The *bare* pair hands each tensor
back as it is: the least any saved-tensor hook can cost. The *copying* pair copies each
tensor into a new host tensor in pack and into a new device tensor in unpack (four tensor
operations, no bookkeeping): the least any swap done in Python hooks can cost. Runs
alternate and each repeat pairs one run of each, so a slow moment of a shared machine hits
both.

Example:
    >>> from bench.overhead.models import tanhs
    >>> floor = measure_floor(tanhs(units=50), repeats=2, warmup=1, steps=3)
    >>> floor.saved_tensors, floor.per_saved_tensor_seconds.n
    (53, 2)
    >>> measure_floor(tanhs(units=50), repeats=2, warmup=1, steps=3, copying=True).saved_tensors
    53
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench.measure import synchronize
from bench.overhead.models import count_step
from bench.overhead.spread import Spread
from bench.workloads import Workload

CPU = torch.device("cpu")


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _copy_out(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
    host = torch.empty_like(tensor, device="cpu", pin_memory=tensor.is_cuda)
    host.copy_(tensor, non_blocking=True)  # stream-ordered before the copy back
    return tensor.device, host


def _copy_in(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
    device, host = packed
    back = torch.empty_like(host, device=device)
    back.copy_(host, non_blocking=True)
    return back


HookPair = tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]


def _median_step(
    workload: Workload, hooks: HookPair | None, warmup: int, steps: int, device: torch.device
) -> float:
    torch.manual_seed(0)
    model = workload.build().to(device)
    optimizer = workload.optimizer(model)
    inputs, targets = workload.make_batch(0)
    batch = (inputs.to(device), targets.to(device))
    seconds = []
    for index in range(warmup + steps):
        synchronize(device)
        started = time.perf_counter()
        if hooks is None:
            loss = workload.loss(model, batch)
        else:
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                loss = workload.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if index >= warmup:
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


@dataclass(frozen=True)
class Floor:
    """Seconds per saved tensor of a bare hook pair, and the plain and hooked step times."""

    saved_tensors: int
    per_saved_tensor_seconds: Spread
    plain_step_seconds: Spread
    hooked_step_seconds: Spread


def measure_floor(
    workload: Workload,
    repeats: int,
    warmup: int,
    steps: int,
    device: torch.device = CPU,
    *,
    copying: bool = False,
) -> Floor:
    """Median over ``repeats`` paired runs of (hooked - plain) step time per saved tensor, with
    the bare pair or, ``copying``, the pair that copies each saved tensor out and back."""
    saved = count_step(workload).saved_tensors
    hooks: HookPair = (_copy_out, _copy_in) if copying else (_identity, _identity)
    plain, hooked, per_tensor = [], [], []
    for repeat in range(repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        times = {on: _median_step(workload, hooks if on else None, warmup, steps, device) for on in order}
        plain.append(times[False])
        hooked.append(times[True])
        per_tensor.append((times[True] - times[False]) / saved)
    spreads = [Spread.of(values) for values in (per_tensor, plain, hooked)]
    assert all(spread is not None for spread in spreads)
    return Floor(saved, *spreads)  # type: ignore[arg-type]
