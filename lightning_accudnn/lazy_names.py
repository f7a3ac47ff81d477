"""A package's public names imported on first use (PEP 562's module ``__getattr__``).

Example:
    >>> namespace = {"__name__": "demo"}
    >>> __getattr__, __dir__ = lazy_names(namespace, {"sqrt": "math"})
    >>> __getattr__("sqrt")(4.0), "sqrt" in namespace, "sqrt" in __dir__()
    (2.0, True, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    namespace: dict[str, Any], names: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the module whose ``globals()`` is ``namespace``:
    each name of ``names`` is imported from the module named beside it when first asked for,
    then kept in ``namespace`` (later lookups do not reach ``__getattr__``)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
