"""What a result was measured on: device, software versions, git commit.

Example:
    >>> device_slug(torch.device("cpu"))
    'cpu'
    >>> slugify("NVIDIA H100 80GB HBM3")
    'nvidia-h100-80gb-hbm3'
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import psutil
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def slugify(text: str) -> str:
    """Lower case, runs of anything but letters and digits become one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` on CUDA, ``"cpu"`` otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def device_slug(device: torch.device) -> str:
    """The results folder of ``device``: ``cpu`` or the GPU's name as a slug."""
    return slugify(device_name(device))


def resolve_device(spec: str) -> torch.device:
    """``"auto"`` (CUDA when there is one), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
        device = torch.device(
            "cuda", device.index if device.index is not None else torch.cuda.current_device()
        )
    return device


def _git(*args: str, cwd: Path = REPO_ROOT) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout


def git_commit(checkout: Path = REPO_ROOT) -> str | None:
    """The commit ``checkout`` (a git working tree) has checked out, ``None`` outside one.

    Example:
        >>> len(git_commit() or "0" * 40)
        40
    """
    commit = _git("rev-parse", "HEAD", cwd=checkout)
    return (commit.strip() or None) if commit else None


def git_state() -> dict[str, Any]:
    """The commit checked out and whether tracked files differ from it.

    Example:
        >>> sorted(git_state())
        ['commit', 'dirty', 'dirty_paths']
    """
    status = _git("status", "--porcelain", "--untracked-files=no")
    dirty_paths = [line[3:] for line in status.splitlines() if line.strip()] if status else []
    return {
        "commit": git_commit(),
        "dirty": bool(dirty_paths) if status is not None else None,
        "dirty_paths": dirty_paths,
    }


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver version from NVML (package ``nvidia-ml-py``), ``None`` if unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _version(module: str) -> str | None:
    try:
        imported = __import__(module)
    except ImportError:
        return None
    return getattr(imported, "__version__", None)


def environment(device: torch.device) -> dict[str, Any]:
    """Everything a reader needs to place a result: device, versions, commit, settings.

    ``driver`` is the NVIDIA driver (``None`` on CPU); ``cuda`` is the CUDA version torch
    was built with (present in a CUDA build even when the run is on the CPU).

    Example:
        >>> env = environment(torch.device("cpu"))
        >>> env["device"], env["driver"]
        ('cpu', None)
    """
    on_cuda = device.type == "cuda"
    properties = torch.cuda.get_device_properties(device) if on_cuda else None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(device),
        "device_slug": device_slug(device),
        "device_type": device.type,
        "device_total_memory_bytes": properties.total_memory if properties is not None else None,
        "device_capability": f"{properties.major}.{properties.minor}" if properties is not None else None,
        "git": git_state(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": nvidia_driver_version() if on_cuda else None,
        "torchvision": _version("torchvision"),
        "lightning": _version("lightning"),
        "lightning_accudnn": _version("lightning_accudnn"),
        "torchtune": _version("torchtune"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "host_memory_bytes": psutil.virtual_memory().total,
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }
