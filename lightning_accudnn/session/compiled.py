"""Every way of compiling a module is refused before training, with one message.

Saved-tensor hooks and ``torch.compile`` interact badly (pytorch issues #116221, #148222):
inside a compiled graph the hooks may not run, so activations could silently stay on the
device. A compiled model is therefore refused, whichever way it was compiled:
``torch.compile(model)`` (the ``OptimizedModule`` wrapper, also as a submodule),
``model.compile()`` (``LightningModule.compile()`` included) and ``module.compile()`` on a
submodule (the regional form).
"""

from __future__ import annotations

from torch import nn

from lightning_accudnn.session._torch_internals import compiled_in_place, is_compiled_wrapper

__all__ = ["CompiledModelError", "compiled_form", "refuse_compiled", "refusal_message"]


class CompiledModelError(ValueError):
    """The model, or one of its submodules, was compiled with ``torch.compile``."""


def compiled_form(model: nn.Module) -> str | None:
    """How ``model`` or a submodule was compiled, in words; ``None`` when nothing was.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        >>> compiled_form(model) is None
        True
        >>> model[0].compile()
        >>> compiled_form(model)
        "module.compile() on submodule '0' (the regional form)"
    """
    for name, module in model.named_modules():
        where = f"submodule {name!r}" if name else f"the model ({type(module).__name__})"
        if is_compiled_wrapper(module):
            if name:
                return f"torch.compile(...) of {where} (the regional form)"
            return "torch.compile(model)"
        if compiled_in_place(module):
            if name:
                return f"module.compile() on {where} (the regional form)"
            return f"{type(module).__name__}.compile() on the model"
    return None


def refusal_message(form: str) -> str:
    """The one message every compiled model is refused with; ``form`` says what was found."""
    return (
        f"lightning-accudnn refuses a compiled model: found {form}. The saved-tensor hooks that swap "
        "activations are not reliably honoured inside compiled graphs (pytorch issues #116221, #148222), so "
        "activations could silently stay on the device. Every form of torch.compile is refused: "
        "torch.compile(model), model.compile() (LightningModule.compile() too) and the regional form, "
        "module.compile() or torch.compile(block) on submodules. Train the uncompiled model, or compile "
        "without lightning-accudnn and use torch._functorch.config.activation_memory_budget."
    )


def refuse_compiled(model: nn.Module) -> None:
    """Raise :class:`CompiledModelError` when ``model`` or a submodule is compiled.

    Example:
        >>> refuse_compiled(nn.Linear(2, 2))  # not compiled: nothing happens
    """
    form = compiled_form(model)
    if form is not None:
        raise CompiledModelError(refusal_message(form))
