"""Folders a run creates, and removing them again when the run leaves them empty (a refused or failed run leaves
nothing behind)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


def missing_folders(path: str | os.PathLike) -> list[Path]:
    """``path`` (made absolute) and its parents that do not exist yet, deepest first."""
    folder = Path(os.path.abspath(Path(path).expanduser()))
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_empty_folders(folders: Iterable[Path]) -> None:
    """Remove ``folders`` (deepest first, as :func:`missing_folders` lists them) that are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
