"""What the session needs to know about a device: that it exists, and its memory."""

from __future__ import annotations

import psutil
import torch

from lightning_accudnn.planner.budget import format_bytes
from lightning_accudnn.planner.headroom import Headroom
from lightning_accudnn.session.config import OffloadConfig, default_reserve_bytes

__all__ = ["device_memory", "require_available", "resolve_headroom", "with_index"]


def require_available(device: torch.device) -> None:
    """Refuse a CUDA device on a machine without one, saying so plainly.

    Example:
        >>> require_available(torch.device("cpu"))  # always there
    """
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {str(device)!r} was asked for, but no CUDA device is available "
            "(torch.cuda.is_available() is False): run on a machine with a GPU and a CUDA build of "
            "PyTorch, or use the CPU (no memory is saved there)"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(
            f"device {str(device)!r} was asked for, but only {torch.cuda.device_count()} CUDA device(s) exist"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"lightning-accudnn runs on CUDA or CPU devices, not {device.type!r}")


def device_memory(device: torch.device) -> tuple[int, int, str]:
    """Total bytes, free bytes and a name for ``device`` (system RAM for the CPU).

    Example:
        >>> total, free, name = device_memory(torch.device("cpu"))
        >>> 0 < free <= total, name
        (True, 'host memory (CPU device)')
    """
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free, torch.cuda.get_device_name(device)
    memory = psutil.virtual_memory()
    return memory.total, memory.available, "host memory (CPU device)"


def with_index(device: torch.device) -> torch.device:
    """``device`` with its index: a bare ``"cuda"`` is the current CUDA device.

    Some CUDA calls refuse a device without an index (PyTorch 2.11's
    ``set_per_process_memory_fraction`` does), and the session caps the allocator of one device.

    Example:
        >>> with_index(torch.device("cpu")), with_index(torch.device("cuda", 1))
        (device(type='cpu'), device(type='cuda', index=1))
    """
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_headroom(config: OffloadConfig, device: torch.device) -> tuple[Headroom, str]:
    """The headroom ``config`` gives on ``device``, and the device's name: the budget resolved
    against the device's memory (``"auto"``: all of its free memory) and one reserve under it
    (``config.reserve_bytes``, or :func:`~lightning_accudnn.session.config.default_reserve_bytes`).

    Example:
        >>> room, name = resolve_headroom(OffloadConfig(budget="1GB"), torch.device("cpu"))
        >>> room.budget_bytes, room.reserve_bytes, name
        (1000000000, 0, 'host memory (CPU device)')
    """
    total, free, name = device_memory(device)
    budget_bytes = config.parsed_budget.resolve(total, free, device_name=name)
    reserve = config.reserve_bytes
    if reserve is None:
        reserve = default_reserve_bytes(budget_bytes, device.type)
    if config.parsed_budget.kind == "auto" and budget_bytes <= reserve:
        raise ValueError(
            f'budget "auto": {name} has only {format_bytes(budget_bytes)} free, no more than the reserve '
            f"of {format_bytes(reserve)}; free some memory or give an explicit budget"
        )
    return Headroom(budget_bytes, reserve), name
