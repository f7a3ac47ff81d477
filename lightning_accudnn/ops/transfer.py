"""Moving bytes between the device and the host: a CUDA copy-stream backend and a host-copy one.

Both move flat ``uint8`` views of whole storages. The CUDA backend works on a dedicated
copy stream ordered against the compute stream by events; the host-copy backend does the
same copies synchronously on CPU tensors so that every decision of the engine runs (and is
tested) without a GPU.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch


class Transfer(Protocol):
    """A copy in flight."""

    def done(self) -> bool: ...

    def synchronize(self) -> None: ...


class TransferBackend(Protocol):
    """What the engine needs from a backend."""

    device: torch.device
    pin_memory: bool

    def copy_out(self, source: torch.Tensor, host_buffer: torch.Tensor) -> Transfer:
        """Start copying device bytes ``source`` into the host buffer."""

    def copy_in(self, host_bytes: torch.Tensor) -> tuple[torch.Tensor, Transfer]:
        """Start copying host bytes to a new device tensor; returns it and the copy."""

    def use_on_compute(self, device_bytes: torch.Tensor, transfer: Transfer | None) -> None:
        """Make the compute stream wait for ``transfer`` before it reads ``device_bytes``."""

    def collect_wait_seconds(self) -> float:
        """Seconds the compute stream waited on copies since the last call."""


class _Finished:
    def done(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


FINISHED = _Finished()


class HostCopyBackend:
    """Synchronous copies between CPU tensors; the "device" is the CPU itself.

    No memory is saved this way: it exists so that the engine, the plan and the budget
    arithmetic run for real on machines without a GPU. The compute "stream" is the calling
    thread, so every copy counts as time the compute waited.

    Example:
        >>> backend = HostCopyBackend()
        >>> source = torch.arange(8, dtype=torch.uint8)
        >>> host = torch.empty(8, dtype=torch.uint8)
        >>> backend.copy_out(source, host).done()
        True
        >>> back, _ = backend.copy_in(host)
        >>> bool(torch.equal(back, source))
        True
    """

    device = torch.device("cpu")
    pin_memory = False

    def __init__(self) -> None:
        self._waited = 0.0

    def copy_out(self, source: torch.Tensor, host_buffer: torch.Tensor) -> Transfer:
        start = time.perf_counter()
        host_buffer.copy_(source)
        self._waited += time.perf_counter() - start
        return FINISHED

    def copy_in(self, host_bytes: torch.Tensor) -> tuple[torch.Tensor, Transfer]:
        start = time.perf_counter()
        device_bytes = host_bytes.clone()
        self._waited += time.perf_counter() - start
        return device_bytes, FINISHED

    def use_on_compute(self, device_bytes: torch.Tensor, transfer: Transfer | None) -> None:
        pass

    def collect_wait_seconds(self) -> float:
        waited, self._waited = self._waited, 0.0
        return waited


class _CudaTransfer:
    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def done(self) -> bool:
        return self.event.query()

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaStreamBackend:
    """Copies on a dedicated CUDA stream into and out of pinned host memory.

    Stream-ordered allocator rules kept here: a copy out first waits for the compute
    stream (the activation must be written before it is read) and the caller holds the
    source until the copy is :meth:`~Transfer.done`; a tensor copied in is allocated on
    the copy stream and ``record_stream``-ed to the compute stream when handed over, so
    its block is not reused before compute has read it. A wait is timed with two events
    on the compute stream around ``wait_event``, only when the copy is still running.

    Example:
        >>> backend = CudaStreamBackend(torch.device("cuda", 0))  # doctest: +SKIP
    """

    pin_memory = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.copy_stream = torch.cuda.Stream(device)
        self._wait_probes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def _compute_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def _record(self) -> _CudaTransfer:
        event = torch.cuda.Event()
        event.record(self.copy_stream)
        return _CudaTransfer(event)

    def copy_out(self, source: torch.Tensor, host_buffer: torch.Tensor) -> Transfer:
        self.copy_stream.wait_stream(self._compute_stream())
        with torch.cuda.stream(self.copy_stream):
            host_buffer.copy_(source, non_blocking=True)
            return self._record()

    def copy_in(self, host_bytes: torch.Tensor) -> tuple[torch.Tensor, Transfer]:
        with torch.cuda.stream(self.copy_stream):
            device_bytes = torch.empty(host_bytes.numel(), dtype=torch.uint8, device=self.device)
            device_bytes.copy_(host_bytes, non_blocking=True)
            return device_bytes, self._record()

    def use_on_compute(self, device_bytes: torch.Tensor, transfer: Transfer | None) -> None:
        compute = self._compute_stream()
        if isinstance(transfer, _CudaTransfer):
            if transfer.done():
                compute.wait_event(transfer.event)
            else:
                before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                before.record(compute)
                compute.wait_event(transfer.event)
                after.record(compute)
                self._wait_probes.append((before, after))
            device_bytes.record_stream(compute)

    def collect_wait_seconds(self) -> float:
        waited = 0.0
        for before, after in self._wait_probes:
            after.synchronize()
            waited += before.elapsed_time(after) / 1000.0
        self._wait_probes.clear()
        return waited


def make_backend(device: torch.device) -> HostCopyBackend | CudaStreamBackend:
    """The backend for ``device``: CUDA streams on a GPU, host copies on CPU.

    Example:
        >>> type(make_backend(torch.device("cpu"))).__name__
        'HostCopyBackend'
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return CudaStreamBackend(torch.device("cuda", index))
    if device.type == "cpu":
        return HostCopyBackend()
    raise ValueError(f"lightning-accudnn swaps activations on CUDA or CPU devices, not {device.type!r}")
