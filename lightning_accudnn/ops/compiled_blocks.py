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

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["CallWrapHandle", "compiled_in_place", "is_compiled_wrapper", "wrap_compiled_call"]


def is_compiled_wrapper(module: nn.Module) -> bool:
    """True when ``module`` is the wrapper ``torch.compile(module)`` returns (``OptimizedModule``).

    Example:
        >>> is_compiled_wrapper(torch.compile(nn.Linear(2, 2))), is_compiled_wrapper(nn.Linear(2, 2))
        (True, False)
    """
    compiled = getattr(torch._dynamo, "OptimizedModule", None)
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
