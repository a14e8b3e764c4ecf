"""A package face whose names load on first use (PEP 562 ``__getattr__``), so that importing the package loads
none of its heavy modules: ``__all__, __getattr__ = lazy_face(__name__, _HOMES)``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(package: str, homes: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """The ``__all__`` of ``package`` (the names of ``homes``, sorted) and its module ``__getattr__``, which imports
    name ``N`` from module ``homes[N]`` when first asked."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return sorted(homes), __getattr__
