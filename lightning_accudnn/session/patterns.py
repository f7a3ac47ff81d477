"""``keep_on_device`` patterns are checked against the model before it trains: a typo is refused."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence

from torch import nn

__all__ = ["UnmatchedPatternError", "check_keep_on_device"]


class UnmatchedPatternError(ValueError):
    """A ``keep_on_device`` pattern names no module of the model (most likely a typo).

    Example:
        >>> try:
        ...     check_keep_on_device(["encoder.*"], nn.Sequential(nn.Linear(2, 2)))
        ... except ValueError as error:  # raised before training, with the closest names
        ...     type(error).__name__
        'UnmatchedPatternError'
    """


def check_keep_on_device(patterns: Sequence[str], model: nn.Module) -> None:
    """Raise :class:`UnmatchedPatternError` for the first pattern no submodule name matches.

    The message names the closest module names, so that the typo is easy to fix.

    Example:
        >>> model = nn.Sequential()
        >>> model.add_module("net", nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
        >>> check_keep_on_device(["net.0", "net.*"], model)  # both match: nothing happens
        >>> check_keep_on_device(["nett.0"], model)
        Traceback (most recent call last):
        ...
        lightning_accudnn.session.patterns.UnmatchedPatternError: keep_on_device pattern 'nett.0' \
matches no module of Sequential; closest module names: 'net.0', 'net.1', 'net'. Patterns are fnmatch \
patterns over qualified module names (as model.named_modules() gives them).
    """
    names = [name for name, _ in model.named_modules() if name]
    for pattern in patterns:
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            continue
        close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.5)
        hint = (
            f"closest module names: {', '.join(repr(name) for name in close)}"
            if close
            else f"the model's top-level modules are {', '.join(repr(n) for n in names if '.' not in n)}"
        )
        raise UnmatchedPatternError(
            f"keep_on_device pattern {pattern!r} matches no module of {type(model).__name__}; {hint}. "
            "Patterns are fnmatch patterns over qualified module names (as model.named_modules() gives them)."
        )
