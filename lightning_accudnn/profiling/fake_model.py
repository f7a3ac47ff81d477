"""Build a model for the dry-run trace: its parameters and buffers fake tensors of one
:class:`~torch._subclasses.fake_tensor.FakeTensorMode`, taking no memory, and, for a
``-true`` precision, cast to that dtype.

Example:
    >>> from torch._subclasses.fake_tensor import FakeTensorMode
    >>> fake_mode = FakeTensorMode()
    >>> model = build_fake(lambda: nn.Linear(4, 2), fake_mode)
    >>> with fake_mode:
    ...     cast_floating(model, torch.bfloat16)
    >>> model.weight.dtype, isinstance(model.weight, nn.Parameter), model.weight.requires_grad
    (torch.bfloat16, True, True)
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.overrides import TorchFunctionMode

__all__ = ["build_fake", "cast_floating"]

#: In-place initialisers that only write values (a fake tensor has none): under
#: :class:`_SkipValueFills` they return their tensor without dispatching anything.
_VALUE_FILLS = frozenset(
    {
        torch.Tensor.normal_,
        torch.Tensor.uniform_,
        torch.Tensor.zero_,
        torch.Tensor.fill_,
        nn.init.normal_,
        nn.init.uniform_,
        nn.init.constant_,
        nn.init.kaiming_uniform_,
    }
)


class _SkipValueFills(TorchFunctionMode):
    """While a model is built under fake tensors, in-place value fills do nothing.

    They leave shape, strides and dtype as they are, and a fake tensor holds no values, so
    dispatching them (thousands of calls for a large model) would only cost time.
    """

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: object,
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        if func in _VALUE_FILLS:
            tensor = args[0] if args else kwargs["tensor"]
            if isinstance(tensor, FakeTensor):
                return tensor
        return func(*args, **kwargs)


#: How ``Module._apply`` fails on fake parameters: it swaps them for their converted copies, and
#: a fake tensor of a mode is weakly referenced by that mode, which ``torch.utils.swap_tensors``
#: refuses. A factory ending in ``.to(torch.bfloat16)`` or ``.to(memory_format=...)`` meets it.
_FAKE_CONVERSION_REFUSED = "_apply(): Couldn't swap"
#: How reading a meta tensor's values fails ("Cannot copy out of meta tensor; no data!").
_META_DATA_READ = "meta tensor"


def build_fake(build: Callable[[], nn.Module], fake_mode: FakeTensorMode) -> nn.Module:
    """Build the model with fake parameters and buffers belonging to ``fake_mode``.

    In-place value fills (``normal_``, ``uniform_``, ``zero_``, ``fill_`` and the ``nn.init``
    functions made of them) are skipped on fake tensors (:class:`_SkipValueFills`).
    Initialisers that look at values (the rejection sampling in ``nn.init.trunc_normal_``)
    make the builder run on the meta device instead, as do conversions of the built module
    (``Module.to`` a dtype or a memory format, which fake parameters refuse); a constructor that
    reads the values of tensors it computes runs with only its parameters on the meta device
    (:func:`_build_without_data`), and a move to a device is refused with what to do. Either
    way, a parameter or buffer that is not a fake tensor of ``fake_mode`` (a meta tensor, a CPU
    tensor, or a fake tensor that ``copy.deepcopy`` gave a mode of its own, as in
    ``nn.TransformerEncoder``) is replaced by an uninitialised fake CPU tensor of the same shape,
    strides and dtype.
    """
    try:
        with fake_mode, _SkipValueFills(), warnings.catch_warnings():
            # copy.deepcopy of a fake tensor (nn.TransformerEncoder clones its layer) checks
            # its data pointer; harmless here, and the copy is replaced below.
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            model = build()
    except (DataDependentOutputException, DynamicOutputShapeException):
        model = _build_without_data(build)
    except RuntimeError as error:
        if not str(error).startswith(_FAKE_CONVERSION_REFUSED):
            raise
        model = _build_without_data(build)
    _check_module(model)

    with fake_mode:  # a parameter or buffer not of this mode: one of it, same dtype
        _renew_tensors(
            model,
            lambda tensor: (
                None if isinstance(tensor, FakeTensor) and tensor.fake_mode is fake_mode else tensor.dtype
            ),
        )
    return model


def _build_without_data(build: Callable[[], nn.Module]) -> nn.Module:
    """Build the model on the meta device; where its constructor reads the values of tensors it
    computes (RegNet computes its stages' widths with tensors), with only its parameters put on
    the meta device as they are registered (:func:`_parameters_on_meta`)."""
    try:
        with torch.device("meta"):
            return build()
    except NotImplementedError as error:
        if _META_DATA_READ not in str(error):
            raise
    try:
        with _parameters_on_meta():
            return build()
    except NotImplementedError as error:
        if _META_DATA_READ not in str(error):
            raise
        raise RuntimeError(
            "the model factory reads the values of the model's parameters or moves the model to a "
            "device (Module.to('cpu'), .cuda()...), which a model traced without memory cannot do; "
            "return the model as built (dtype and memory-format conversions are fine): accudnn plan "
            "traces it for the GPU named"
        ) from error


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers meanwhile is put on the meta device at once (made on the
    CPU, one at a time), its initialisation with it; other tensors stay on the CPU, with values."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not isinstance(param, nn.parameter.UninitializedParameter):
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """Give ``model`` floating-point parameters and buffers of ``dtype`` (``Module.to`` swaps
    tensors in place, which fake parameters refuse): new ones of the same shape, ties kept.
    Run it under the fake mode the model's tensors belong to."""
    _renew_tensors(
        model, lambda tensor: dtype if tensor.is_floating_point() and tensor.dtype != dtype else None
    )


def _renew_tensors(model: nn.Module, dtype_for: Callable[[torch.Tensor], torch.dtype | None]) -> None:
    """Replace each parameter and buffer for which ``dtype_for`` names a dtype by an
    uninitialised CPU tensor of that dtype, shape and strides (made in the current mode; a
    parameter stays a parameter, with its ``requires_grad``). Tied tensors stay tied."""
    replaced: dict[int, torch.Tensor] = {}
    for module in model.modules():
        tables: tuple[dict[str, torch.Tensor | None], ...] = (module._parameters, module._buffers)  # type: ignore[assignment]
        for table in tables:
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in replaced:
                    dtype = dtype_for(tensor)
                    if dtype is None:
                        continue
                    fresh = torch.empty_strided(tensor.shape, tensor.stride(), dtype=dtype, device="cpu")
                    if isinstance(tensor, nn.Parameter):
                        fresh = nn.Parameter(fresh, requires_grad=tensor.requires_grad)
                    replaced[id(tensor)] = fresh
                table[name] = replaced[id(tensor)]


def _check_module(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"the model factory returned {type(model).__name__}, not an nn.Module")
