"""Package faces that load on first use, and modules that moved."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

REMOVED_IN = "0.2.0"  # the release that drops the old names kept here and in terra.config.moved


def lazy_face(package: str, homes: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """The ``__all__`` of ``package`` and a module ``__getattr__`` that imports name ``N`` from ``homes[N]``."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return sorted(homes), __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module's old name and loads it as the module at its new name."""

    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved  # old full name -> new full name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old name goes in {REMOVED_IN}", FutureWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is the new one, already loaded."""


def moved_modules(package: str, moved: Mapping[str, str], home: str | None = None) -> dict[str, str]:
    """Make ``package.OLD`` import as ``home.NEW`` for each ``OLD: NEW`` of ``moved``."""
    home = home or package
    table = {f"{package}.{old}": f"{home}.{new}" for old, new in moved.items()}
    finder = next((f for f in sys.meta_path if isinstance(f, _MovedModules)), None)
    if finder is None:
        finder = _MovedModules({})
        sys.meta_path.insert(0, finder)
    finder.moved.update(table)
    return table


def renamed(module: str, names: Mapping[str, str], home: str | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` answering each old name of ``names`` with its new object, with a ``FutureWarning``."""
    home = home or module

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is now {home}.{names[name]}; the old name goes in {REMOVED_IN}",
                      FutureWarning, stacklevel=2)
        return getattr(importlib.import_module(home), names[name])

    return __getattr__
