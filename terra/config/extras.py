"""The extras of pyproject.toml an app needs, checked before anything loads.

``make demo`` installs the project alone; ``terra-serve`` without FastAPI, or ``terra-drive`` without SciPy, is then
one line naming the extra to install, not a traceback at import or an internal error minutes into a run. The
extras' packages are read from the installed project's metadata, so pyproject.toml stays their one list.
"""

from __future__ import annotations

import importlib.metadata
import re

from terra.core.errors import TerraInputError

PROJECT = "terra-world-model"  # pyproject.toml's [project] name


def extra_packages(extra: str) -> list[str]:
    """The distributions pyproject.toml's ``extra`` requires (none when the project is not installed)."""
    try:
        requires = importlib.metadata.requires(PROJECT) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found = []
    for line in requires:
        name, _, marker = line.partition(";")
        if re.search(rf"extra\s*==\s*[\"']{re.escape(extra)}[\"']", marker):
            found.append(re.match(r"\s*([A-Za-z0-9][\w.-]*)", name).group(1))
    return found


def installed(name: str) -> bool:
    """Whether the distribution ``name`` is installed."""
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check_extras(extras: tuple[str, ...]) -> None:
    """One line for the first of ``extras`` (pyproject.toml's names) with a package missing."""
    for extra in extras:
        missing = [name for name in extra_packages(extra) if not installed(name)]
        if missing:
            raise TerraInputError(f"the {extra} extra is not installed ({', '.join(missing)} missing): pip install -e "
                                  f"'.[{extra}]' (make test installs every extra)")
