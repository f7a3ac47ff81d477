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

A compiled block is recomputed (the plan's third choice) as a whole, from the same boundary:
the wrapper's ``forward`` (which calls the compiled code) or the in-place block's
``_compiled_call_impl`` runs under non-reentrant checkpointing, so the block's compiled
forward runs again in backward unchanged (no module inside it is wrapped, nothing traced
changes, and it is not compiled again). Several observers may wrap one in-place block's call
(the layer tracker, the recompute probe, the recomputer): :func:`wrap_compiled_call` chains
them, and each :class:`CallWrapHandle` takes out its own link, in any order.
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


class _WrappedCall:
    """One link of an in-place compiled block's chain of wrapped calls: calling it runs
    ``around(inner, *args, **kwargs)``, ``inner`` being the call it wraps (the compiled code,
    or the next link).

    Example:
        >>> link = _WrappedCall(lambda call, x: call(x) + 1, lambda x: 2 * x)
        >>> link(3)
        7
    """

    __slots__ = ("around", "inner")

    def __init__(self, around: Callable[..., Any], inner: Callable[..., Any]) -> None:
        self.around = around
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.around(self.inner, *args, **kwargs)


class CallWrapHandle:
    """Undoes :func:`wrap_compiled_call` (the same ``remove()`` as a hook's handle): takes its
    link out of the block's chain wherever it is (links may be removed in any order).

    Example:
        >>> block = nn.Linear(2, 2)
        >>> block.compile()
        >>> original = block._compiled_call_impl
        >>> inner = wrap_compiled_call(block, lambda call, *args: call(*args))
        >>> outer = wrap_compiled_call(block, lambda call, *args: call(*args))
        >>> inner.remove(); block._compiled_call_impl.inner is original
        True
        >>> outer.remove(); block._compiled_call_impl is original
        True
    """

    __slots__ = ("module", "link")

    def __init__(self, module: nn.Module, link: _WrappedCall) -> None:
        self.module: nn.Module | None = module
        self.link = link

    def remove(self) -> None:
        """Take the link out of the chain. Idempotent."""
        module, link = self.module, self.link
        if module is None:
            return
        self.module = None
        current = module._compiled_call_impl
        if current is link:
            module._compiled_call_impl = link.inner
            return
        while isinstance(current, _WrappedCall):
            if current.inner is link:
                current.inner = link.inner
                return
            current = current.inner


def wrap_compiled_call(module: nn.Module, around: Callable[..., Any]) -> CallWrapHandle:
    """Run each call of ``module``, a module compiled in place (``module.compile()``), as
    ``around(call, *args, **kwargs)`` outside its compiled region, ``call`` running the
    compiled code (through the links added before this one).

    Example:
        >>> import torch
        >>> block = nn.Linear(2, 2)
        >>> block.compile(backend="eager")
        >>> seen = []
        >>> handle = wrap_compiled_call(block, lambda call, x: (seen.append(x.shape), call(x))[1])
        >>> _ = block(torch.ones(1, 2)); handle.remove(); seen
        [torch.Size([1, 2])]
    """
    original = module._compiled_call_impl
    if original is None:
        raise ValueError(f"{type(module).__name__} was not compiled in place (module.compile())")
    link = _WrappedCall(around, original)
    module._compiled_call_impl = link
    return CallWrapHandle(module, link)
