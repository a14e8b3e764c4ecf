"""Package faces that load on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(package: str, homes: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """The ``__all__`` of ``package`` and a module ``__getattr__`` that imports name ``N`` from ``homes[N]``."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return sorted(homes), __getattr__
