"""Compiled blocks: modules whose calls run in a ``torch.compile`` region, seen from outside it.

A block compiled on its own (regional compilation) is one layer for the engine: everything
it saves for backward is attributed to it. Its boundary must be observed where Dynamo does
not trace, or the observer becomes part of the compiled graph and changes its guards (a
module hook added or removed between passes recompiles the block):

* ``torch.compile(block)`` returns an ``OptimizedModule`` wrapper whose own hooks run in
  eager mode, before it enters the compiled code: the wrapper is hooked as usual;
* ``block.compile()`` compiles the module's whole ``_call_impl`` (its hooks included): the
  call is observed by wrapping the module's ``_compiled_call_impl``, which
  ``nn.Module.__call__`` calls from eager code.

Modules inside a compiled block are never hooked.

Recomputation (the plan's third choice) of a compiled block is not wired here: a compiled
block recomputes as a whole, by running its call under non-reentrant checkpointing from the
same boundary (the wrapper's call, or the in-place block's ``_compiled_call_impl``, as
:func:`wrap_compiled_call` does), never by wrapping a module inside it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

__all__ = [
    "CallWrapHandle",
    "compiled_in_place",
    "is_compiled_wrapper",
    "modules_outside_compiled_code",
    "wrap_compiled_call",
]


def is_compiled_wrapper(module: nn.Module) -> bool:
    """True when ``module`` is the wrapper ``torch.compile(module)`` returns (``OptimizedModule``).

    Example:
        >>> import torch
        >>> is_compiled_wrapper(torch.compile(nn.Linear(2, 2))), is_compiled_wrapper(nn.Linear(2, 2))
        (True, False)
    """
    dynamo = sys.modules.get("torch._dynamo")  # never imported here: importing it takes seconds
    compiled = getattr(dynamo, "OptimizedModule", None) if dynamo is not None else None
    return compiled is not None and isinstance(module, compiled)


def compiled_in_place(module: nn.Module) -> bool:
    """True when ``module.compile()`` was called (``nn.Module._compiled_call_impl`` is set).

    Example:
        >>> block = nn.Linear(2, 2)
        >>> block.compile()
        >>> compiled_in_place(block)
        True
    """
    return getattr(module, "_compiled_call_impl", None) is not None


def modules_outside_compiled_code(model: nn.Module) -> Iterator[tuple[str, nn.Module, bool]]:
    """``(name, module, compiled)`` for the modules of ``model`` whose calls Python runs: every
    module but those inside a compiled block; ``compiled`` marks the compiled blocks themselves
    (hooks inside them would be traced into their graphs and break or recompile them).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
        >>> model[1].compile()
        >>> [(name, compiled) for name, _, compiled in modules_outside_compiled_code(model)]
        [('', False), ('0', False), ('1', True)]
    """
    compiled_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in compiled_prefixes):
            continue
        compiled = is_compiled_wrapper(module) or compiled_in_place(module)
        if compiled:
            compiled_prefixes.append(f"{name}." if name else "")
        yield name, module, compiled


class CallWrapHandle:
    """Undoes :func:`wrap_compiled_call` (the same ``remove()`` as a hook's handle).

    Example:
        >>> block = nn.Linear(2, 2)
        >>> block.compile()
        >>> original = block._compiled_call_impl
        >>> handle = wrap_compiled_call(block, lambda: None, lambda: None)
        >>> handle.remove(); block._compiled_call_impl is original
        True
    """

    __slots__ = ("module", "original")

    def __init__(self, module: nn.Module, original: Callable[..., Any]) -> None:
        self.module = module
        self.original = original

    def remove(self) -> None:
        if self.module is not None:
            self.module._compiled_call_impl = self.original
            self.module = None  # type: ignore[assignment]


def wrap_compiled_call(
    module: nn.Module, enter: Callable[[], None], leave: Callable[[], None]
) -> CallWrapHandle:
    """Call ``enter`` before and ``leave`` after (also on an exception) each call of ``module``,
    a module compiled in place (``module.compile()``), outside its compiled region."""
    original = module._compiled_call_impl
    if original is None:
        raise ValueError(f"{type(module).__name__} was not compiled in place (module.compile())")

    def call(*args: Any, **kwargs: Any) -> Any:
        enter()
        try:
            return original(*args, **kwargs)
        finally:
            leave()

    module._compiled_call_impl = call
    return CallWrapHandle(module, original)
