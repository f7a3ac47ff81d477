"""Compiled models: regional compilation is supported, a model compiled whole is refused.

A model whose blocks are compiled one by one (``block.compile()``, or
``model.blocks[i] = torch.compile(model.blocks[i])``) trains under the session: each compiled
block is one layer of the plan (everything it saves is attributed to it, see
:mod:`lightning_accudnn.ops.compiled_blocks`), and it is compiled once, since the engine
never hooks a module inside it. A model compiled whole (``torch.compile(model)``,
``model.compile()``, ``LightningModule.compile()``) attributes every saved tensor to one
module, so no per-layer plan can apply from outside: it is refused before training, with one
message that shows the regional form and names the experimental option that plans it inside its
compiled graph instead (``whole_model_compile="experimental"``, see
:mod:`lightning_accudnn.whole_model_compile`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from torch import nn

from lightning_accudnn.ops.compiled_blocks import compiled_in_place, is_compiled_wrapper
from lightning_accudnn.planner.plan import ROUTE_EAGER, ROUTE_REGIONAL

__all__ = [
    "CompiledModelError",
    "compiled_blocks",
    "refusal_message",
    "refuse_whole_model_compile",
    "route_of",
    "whole_model_form",
]

#: How to rewrite a model compiled whole, shown in every refusal.
REGIONAL_FORM = (
    "Compile its blocks one by one instead (regional compilation), e.g.\n"
    "    for block in model.layers:\n"
    "        block.compile()\n"
    "or  model.layers[i] = torch.compile(model.layers[i]),\n"
    "and do not call torch.compile(model), model.compile() or LightningModule.compile(): "
    "each compiled block is then one layer of the plan (kept, swapped or recomputed as a whole)."
)

#: The experimental alternative, named in every refusal.
WHOLE_MODEL_OPTION = (
    "Or, experimentally (tested with PyTorch 2.14.1 only), have the plan applied inside the compiled graph: "
    "whole_model_compile='experimental' (an OffloadConfig field and a strategy keyword)."
)


class CompiledModelError(ValueError):
    """The model was compiled whole, or a pattern names a module inside a compiled block.

    Example:
        >>> import torch
        >>> try:
        ...     refuse_whole_model_compile(torch.compile(nn.Linear(2, 2)))
        ... except ValueError as error:  # raised before training, the message says what to do
        ...     type(error).__name__
        'CompiledModelError'
    """


def whole_model_form(model: nn.Module) -> str | None:
    """How ``model`` itself was compiled, in words; ``None`` when it was not (its blocks may be).

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> model[0].compile()  # regional: fine
        >>> whole_model_form(model) is None
        True
        >>> whole_model_form(torch.compile(model))
        'torch.compile(model)'
        >>> model.compile()
        >>> whole_model_form(model)
        'Sequential.compile() on the model'
    """
    if is_compiled_wrapper(model):
        return "torch.compile(model)"
    if compiled_in_place(model):
        return f"{type(model).__name__}.compile() on the model"
    return None


def compiled_blocks(model: nn.Module) -> tuple[str, ...]:
    """Qualified names of the outermost compiled submodules of ``model`` (its compiled blocks).

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
        >>> model[0].compile(); model[2] = torch.compile(model[2])
        >>> compiled_blocks(model)
        ('0', '2')
    """
    blocks: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(f"{block}.") for block in blocks):
            continue
        if is_compiled_wrapper(module) or compiled_in_place(module):
            blocks.append(name)
    return tuple(blocks)


def route_of(model: nn.Module) -> str:
    """How the plan applies to ``model`` (never asked of a model compiled whole: refused, or on
    the experimental route, :data:`~lightning_accudnn.planner.plan.ROUTE_WHOLE_MODEL`).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> route_of(model)
        'eager, per layer'
        >>> model[0].compile()
        >>> route_of(model)
        'regional compile, per compiled block'
    """
    return ROUTE_REGIONAL if compiled_blocks(model) else ROUTE_EAGER


def refusal_message(form: str) -> str:
    """The one message a model compiled whole is refused with; ``form`` says what was found.

    Example:
        >>> print(refusal_message("torch.compile(model)").splitlines()[0][:70])
        lightning-accudnn refuses a model compiled whole by default: found tor
    """
    return (
        f"lightning-accudnn refuses a model compiled whole by default: found {form}. Inside one compiled "
        "graph every saved activation belongs to one module, so no per-layer plan can apply from outside it. "
        + REGIONAL_FORM
        + " "
        + WHOLE_MODEL_OPTION
    )


def refuse_whole_model_compile(model: nn.Module, keep_on_device: Iterable[str] = ()) -> None:
    """Raise :class:`CompiledModelError` when ``model`` was compiled whole, or when a
    ``keep_on_device`` pattern matches only modules inside compiled blocks (the engine sees a
    compiled block as one layer: name the block instead).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
        >>> model[1].compile()
        >>> refuse_whole_model_compile(model, keep_on_device=["1"])  # regional: nothing happens
        >>> refuse_whole_model_compile(model, keep_on_device=["1.0"])
        Traceback (most recent call last):
        ...
        lightning_accudnn.session.compiled.CompiledModelError: keep_on_device pattern '1.0' matches \
only modules inside the compiled block(s) '1', which the engine sees as one layer each; name the block \
('1') instead
    """
    form = whole_model_form(model)
    if form is not None:
        raise CompiledModelError(refusal_message(form))
    blocks = compiled_blocks(model)
    if not blocks:
        return
    names = [name for name, _ in model.named_modules() if name]
    visible = [name for name in names if not any(name.startswith(f"{block}.") for block in blocks)]
    for pattern in keep_on_device:
        inside = [name for name in names if fnmatch.fnmatchcase(name, pattern) and name not in visible]
        if inside and not any(fnmatch.fnmatchcase(name, pattern) for name in visible):
            owners = sorted({block for block in blocks for name in inside if name.startswith(f"{block}.")})
            raise CompiledModelError(
                f"keep_on_device pattern {pattern!r} matches only modules inside the compiled block(s) "
                f"{', '.join(repr(owner) for owner in owners)}, which the engine sees as one layer each; "
                f"name the block ({', '.join(repr(owner) for owner in owners)}) instead"
            )
