"""The planner is pure: profile in, plan out. It imports the standard library, its own modules
and the profile types only: no torch (so no ``torch.cuda``), no NVML, no FakeTensor trace, no
``ops``, no session, no Lightning."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PLANNER = Path(__file__).resolve().parents[2] / "lightning_accudnn" / "planner"
#: Words that belong to the profiling package or the session, never to the planner's text.
FORBIDDEN_WORDS = ("torch.cuda", "pynvml", "FakeTensorMode")
#: The profile vocabulary the planner reads (``ops`` and the session share it).
PROFILE_TYPES = "lightning_accudnn.profile"


def impure_imports(source: str, package: str = "lightning_accudnn.planner") -> list[str]:
    """The modules ``source`` (a module of ``package``) imports that a pure planner may not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names = [f"{parent}.{node.module}" if node.module else parent]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            allowed = (
                (top in sys.stdlib_module_names and top != "lightning_accudnn")
                or name in (PROFILE_TYPES, package)
                or name.startswith(package + ".")
            )
            if not allowed:
                found.append(name)
    return found


def test_the_check_catches_what_it_must():
    source = """
import math
from collections.abc import Sequence
from lightning_accudnn.profile import StepProfile
from lightning_accudnn.planner.timeline import Simulator
from . import budget
import torch.cuda
from torch._subclasses.fake_tensor import FakeTensorMode
from lightning_accudnn.ops.layers import LayerTracker
from lightning_accudnn.profiling.gpus import get_gpu
from lightning_accudnn import session
from .. import ops

def later():
    import pynvml
"""
    assert impure_imports(source) == [
        "torch.cuda",
        "torch._subclasses.fake_tensor",
        "lightning_accudnn.ops.layers",
        "lightning_accudnn.profiling.gpus",
        "lightning_accudnn",
        "lightning_accudnn",
        "pynvml",
    ]


def _modules() -> list[Path]:
    return sorted(PLANNER.glob("*.py"))


def test_every_planner_module_is_checked():
    names = {path.name for path in _modules()}
    assert {"__init__.py", "plan.py", "search.py", "timeline.py", "recompute.py"} <= names


@pytest.mark.parametrize("module", _modules(), ids=lambda path: path.name)
def test_planner_module_imports_only_the_standard_library_itself_and_the_profile_types(module):
    assert impure_imports(module.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("module", _modules(), ids=lambda path: path.name)
def test_planner_module_never_names_cuda_nvml_or_fake_tensors(module):
    text = module.read_text(encoding="utf-8")
    assert [word for word in FORBIDDEN_WORDS if word in text] == []
