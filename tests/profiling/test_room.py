"""The profiling package makes profiles: it may read the planner's and the profile's types and
how a tensor lies in its storage, and never imports Lightning, the session, the strategies, the
callbacks or ``ops``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROFILING = Path(__file__).resolve().parents[2] / "lightning_accudnn" / "profiling"
#: ``tensor_layout``: how a tensor lies in its storage, which the engine and both sources of a
#: profile must judge alike.
ALLOWED = (
    "lightning_accudnn.profiling",
    "lightning_accudnn.profile",
    "lightning_accudnn.planner",
    "lightning_accudnn.tensor_layout",
)


def _imported(source: str) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def _refused(name: str) -> bool:
    if name.startswith(".") or name.partition(".")[0] in ("lightning", "pytorch_lightning"):
        return True  # relative imports would hide which room they reach
    if name.partition(".")[0] != "lightning_accudnn":
        return False
    return not any(name == room or name.startswith(room + ".") for room in ALLOWED)


def test_the_check_refuses_other_rooms():
    source = "import lightning.pytorch\nfrom lightning_accudnn.ops import layers\nfrom . import trace"
    assert [name for name in _imported(source) if _refused(name)] == [
        "lightning.pytorch",
        "lightning_accudnn.ops",
        ".",
    ]


@pytest.mark.parametrize("module", sorted(PROFILING.glob("*.py")), ids=lambda path: path.name)
def test_profiling_module_imports_no_other_room(module):
    assert [name for name in _imported(module.read_text(encoding="utf-8")) if _refused(name)] == []
