"""Register the strategy names with Lightning without importing Lightning first.

``import lightning_accudnn`` must stay cheap (the ``accudnn plan`` command never needs
Lightning), yet ``Trainer(strategy="accudnn")`` must work in either import order. So: if
``lightning.pytorch`` is already imported, register now; otherwise put a finder on
``sys.meta_path`` that lets ``lightning.pytorch`` load as usual and registers right after
its module body has run, then removes itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["LIGHTNING_MODULE", "STRATEGY_PACKAGE", "register_when_lightning_loads"]

#: The module whose import triggers the registration.
LIGHTNING_MODULE = "lightning.pytorch"


def register_when_lightning_loads() -> None:
    """Register now if Lightning is loaded, else as soon as it is. Idempotent.

    Example:
        >>> register_when_lightning_loads()
        >>> from lightning.pytorch.strategies import StrategyRegistry
        >>> "accudnn" in StrategyRegistry
        True
    """
    if LIGHTNING_MODULE in sys.modules:
        _register()
        return
    if not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


#: The package that registers the names when it is imported (it needs Lightning anyway).
STRATEGY_PACKAGE = "lightning_accudnn.strategy"


def _register() -> None:
    """Import the strategy package, which registers its names at the end of its import.

    If it is being imported right now (its import is what pulled Lightning in), there is
    nothing to do here: it registers once its own import completes.
    """
    if STRATEGY_PACKAGE not in sys.modules:
        importlib.import_module(STRATEGY_PACKAGE)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the real loader of ``lightning.pytorch`` so that the
    strategies are registered once that module has executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != LIGHTNING_MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            execute(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                _register()
            except Exception as error:  # never break the user's own import of Lightning
                warnings.warn(
                    f"lightning-accudnn could not register its strategies with Lightning ({error!r}); "
                    "pass AccUDNNStrategy(...) instead of a strategy name",
                    stacklevel=2,
                )

        loader.exec_module = exec_then_register
        return spec
