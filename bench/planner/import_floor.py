"""``python -m bench.planner.import_floor MODEL``: the imports any ``accudnn plan MODEL`` must make.

In this (fresh) process: ``import torch``, :func:`gc.freeze` as ``python -m lightning_accudnn``
does once torch is imported, then the model's library the way
:func:`lightning_accudnn.cli.resolve_model` finds ``MODEL`` and its factory then imports it:
``torchvision.models`` for ``torchvision:NAME``; for ``module:factory`` the module, then the
import statements written inside the factory's body (``from transformers import GPT2Config,
GPT2LMHeadModel`` for :func:`bench.planner.models.gpt2_medium`), without calling it; and
:func:`gc.freeze` again before the process ends, as the CLI does. Nothing of
``lightning_accudnn`` is imported: what the CLI itself imports (``torch._dynamo`` included) is
its own choice, not the floor. Only the standard library is imported before ``torch``.

Timed from outside by :mod:`bench.planner.speed`, this process is the least any CLI can take for
that model on the machine: the interpreter, torch and the model's library. It prints one JSON
line: the top-level packages it ended with (not the standard library's), and whether
``torch._dynamo`` was imported.

Example (a shell command; the process takes seconds, so it is no doctest)::

    $ PYTHONPATH=bench/planner python -m bench.planner.import_floor models:gpt2_medium
    {"packages": [..., "torch", "transformers", ...], "dynamo": true}
"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import json
import sys

__all__ = ["import_floor", "library_imports"]


def _factory_imports(module: str, attribute: str) -> list[str]:
    """The import statements inside ``module``'s top-level function ``attribute``, read from its
    source file (not imported); none when the factory is no function defined there."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return []
    with open(spec.origin, encoding="utf-8") as file:
        tree = ast.parse(file.read(), spec.origin)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attribute:
            return [
                ast.unparse(inner)
                for inner in ast.walk(node)
                if isinstance(inner, (ast.Import, ast.ImportFrom))
            ]
    return []


def library_imports(model: str) -> list[str]:
    """The import statements that bring in ``model``'s library (``accudnn plan``'s ``MODEL``).

    Example:
        >>> library_imports("torchvision:resnet152")
        ['import torchvision.models']
        >>> library_imports("bench.planner.models:gpt2_medium")
        ['import bench.planner.models', 'from transformers import GPT2Config, GPT2LMHeadModel']
        >>> library_imports("bench.planner.models:tiny_transformer")
        ['import bench.planner.models']
    """
    source, _, attribute = model.partition(":")
    if source == "torchvision":
        return ["import torchvision.models"]
    return [f"import {source}", *_factory_imports(source, attribute)]


def import_floor(model: str) -> dict[str, object]:
    """Import torch, freeze the collector, import ``model``'s library, freeze it again (run it in
    a fresh process); returns the top-level packages then imported (not the standard library's)
    and whether ``torch._dynamo`` was."""
    import torch  # noqa: F401  (the CLI's first import)

    gc.freeze()  # as ``python -m lightning_accudnn`` does once torch is imported
    first, *inner = library_imports(model)
    namespace: dict[str, object] = {"__name__": "__import_floor__"}
    exec(first, namespace)  # noqa: S102  (``import torchvision.models`` or the factory's module)
    namespace["__package__"] = sys.modules[model.partition(":")[0]].__package__  # for ``from .``
    for statement in inner:
        exec(statement, namespace)  # noqa: S102  (the import statements in the factory's body)
    gc.freeze()  # as the CLI does before the process ends
    top_level = {name.partition(".")[0] for name in sys.modules}
    packages = sorted(name for name in top_level - sys.stdlib_module_names if not name.startswith("_"))
    return {"packages": packages, "dynamo": "torch._dynamo" in sys.modules}


if __name__ == "__main__":
    print(json.dumps(import_floor(sys.argv[1])))
