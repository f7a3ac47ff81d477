"""The default cap on host memory for swapped activations: a share of what this process may use.

What a process may use is the smaller of the machine's RAM (psutil) and the memory limit of
its control group (cgroup v2 ``memory.max``, cgroup v1 ``memory.limit_in_bytes``, the
tightest along the group's path), so a container's limit is honoured. The share is divided
among the ranks on the node (``LOCAL_WORLD_SIZE``, set by torchrun and Lightning), so eight
DDP ranks on one node together pin no more than one would alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import psutil

from lightning_accudnn.planner.budget import Budget
from lightning_accudnn.session.config import DEFAULT_HOST_MEMORY_SHARE

__all__ = ["cgroup_memory_limit", "default_host_memory_limit", "host_memory_limit", "local_world_size"]

#: cgroup v1 reports "no limit" as a huge number (a page-rounded 2**63 - 1); anything at
#: or above this is taken as none.
_UNLIMITED_V1 = 2**60


def cgroup_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The memory limit of this process's control group in bytes, or ``None`` when it has none.

    Reads ``proc_cgroup`` (``/proc/self/cgroup``) and, under ``root``, the v2 ``memory.max``
    or v1 ``memory/<path>/memory.limit_in_bytes`` of the group and of each parent group up
    to the root, and returns the smallest limit found.

    Example:
        >>> import tempfile
        >>> base = Path(tempfile.mkdtemp())
        >>> _ = (base / "cgroup").write_text("0::/job\\n")
        >>> (base / "fs" / "job").mkdir(parents=True)
        >>> _ = (base / "fs" / "job" / "memory.max").write_text("8589934592\\n")
        >>> cgroup_memory_limit(base / "cgroup", base / "fs")
        8589934592
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, group = parts
        if controllers == "":  # cgroup v2: one unified hierarchy
            limits += _limits_along(root, group, "memory.max")
        elif "memory" in controllers.split(","):  # cgroup v1: the memory controller's hierarchy
            limits += _limits_along(root / "memory", group, "memory.limit_in_bytes")
    return min(limits) if limits else None


def _limits_along(root: Path, group: str, file_name: str) -> list[int]:
    """The limits set in ``file_name`` of ``group`` and of every group above it."""
    limits = []
    path = root / group.strip("/")
    while True:
        try:
            text = (path / file_name).read_text().strip()
        except OSError:
            text = ""
        if text.isdigit() and int(text) < _UNLIMITED_V1:
            limits.append(int(text))
        if path == root or root not in path.parents:
            return limits
        path = path.parent


def local_world_size(environ: Mapping[str, str] = os.environ) -> int:
    """Ranks on this node: ``LOCAL_WORLD_SIZE`` (torchrun, Lightning), else 1.

    Example:
        >>> local_world_size({"LOCAL_WORLD_SIZE": "8"}), local_world_size({})
        (8, 1)
    """
    value = environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        ranks = int(value)
    except ValueError:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {value!r}") from None
    if ranks < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {value!r}")
    return ranks


def default_host_memory_limit(
    share: float,
    *,
    ranks_on_node: int | None = None,
    cgroup_limit: int | None = None,
    machine_bytes: int | None = None,
) -> int:
    """``share`` of the memory this process may use, divided among the ranks on the node.

    Each figure not given is read: ``ranks_on_node`` from :func:`local_world_size`,
    ``cgroup_limit`` from :func:`cgroup_memory_limit`, ``machine_bytes`` from psutil.

    Example:
        >>> default_host_memory_limit(0.5, ranks_on_node=4, cgroup_limit=16 * 2**30, machine_bytes=64 * 2**30)
        2147483648
        >>> default_host_memory_limit(0.5, ranks_on_node=1, cgroup_limit=None, machine_bytes=8 * 2**30)
        4294967296
    """
    machine = psutil.virtual_memory().total if machine_bytes is None else machine_bytes
    limit = cgroup_memory_limit() if cgroup_limit is None else cgroup_limit
    usable = machine if limit is None else min(machine, limit)
    ranks = local_world_size() if ranks_on_node is None else ranks_on_node
    return int(usable * share) // ranks


def host_memory_limit(limit: Budget | None) -> int:
    """The cap on pinned host memory for swapped activations: ``limit`` (``OffloadConfig.host_memory_limit``)
    against the machine's RAM, or :data:`~lightning_accudnn.session.config.DEFAULT_HOST_MEMORY_SHARE`
    of what this process may use (:func:`default_host_memory_limit`) when it is ``None``.

    Example:
        >>> host_memory_limit(Budget.parse("1GB"))
        1000000000
    """
    if limit is None:
        return default_host_memory_limit(DEFAULT_HOST_MEMORY_SHARE)
    return limit.resolve(int(psutil.virtual_memory().total), device_name="host memory")
