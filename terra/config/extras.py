"""The pyproject extras an app needs, checked before anything loads (one line naming the extra to install)."""

from __future__ import annotations

import importlib.metadata
import re

from terra.core.errors import TerraInputError

PROJECT = "terra-world-model"


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
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check_extras(extras: tuple[str, ...]) -> None:
    """One line for the first of ``extras`` with a package missing."""
    for extra in extras:
        missing = [name for name in extra_packages(extra) if not installed(name)]
        if missing:
            raise TerraInputError(f"the {extra} extra is not installed ({', '.join(missing)} missing): pip install -e "
                                  f"'.[{extra}]' (make test installs every extra)")
