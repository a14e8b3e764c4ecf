"""What a rerun of ``terra-make-dataset`` keeps of an earlier run's outputs: only those recorded with its settings."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterable, Mapping

from terra.config.checks import one_line, shown
from terra.core.atomic import marked
from terra.core.errors import TerraInputError

LEFTOVERS = (".tmp", ".old")  # atomic_dir's ``.<name>.tmp`` and ``.<name>.old`` folders


def kept_outputs(out: Path, found: Iterable[str], wanted: Mapping[str, dict], recorded: Callable[[Path], dict | None],
                 what: str, setting: str, app: str) -> set[str]:
    """The names among ``found`` whose ``recorded`` settings equal ``wanted[name]``.

    The rest of this program's outputs are removed with one line on stderr; an entry not listed in the folder's marker
    raises :class:`TerraInputError` before anything is removed.
    """
    found = sorted(found)
    listed = marked(out)
    foreign = [name for name in found if name not in listed]
    if foreign:
        them = "it" if len(foreign) == 1 else "them"
        raise TerraInputError(
            f"{setting}={one_line(out)} holds {', '.join(shown(n, 60) for n in foreign[:3])}"
            f"{f' and {len(foreign) - 3} more' if len(foreign) > 3 else ''}, which {app} did not write and which "
            f"would be mistaken for its {what}; move {them} away or choose another {setting}")
    keep: set[str] = set()
    changed: dict[str, list[str]] = {}  # stale name -> the settings it was made with otherwise
    unwanted, unrecorded = [], []
    for name in found:
        record = recorded(out / name) if name in wanted else None
        if name not in wanted:
            unwanted.append(name)
        elif record is None:
            unrecorded.append(name)
        elif record == wanted[name]:
            keep.add(name)
        else:
            want = wanted[name]
            changed[name] = sorted(k for k in want.keys() | record.keys() if record.get(k) != want.get(k))
    stale = [*changed, *unwanted, *unrecorded]
    for name in stale:
        _remove(out / name)
    _remove_leftovers(out, listed - set(wanted))
    if stale:
        why = [f"{len(changed)} made with other {', '.join(sorted({k for keys in changed.values() for k in keys}))}"
               if changed else "", f"{len(unwanted)} that this run does not write" if unwanted else "",
               f"{len(unrecorded)} without a record of their settings" if unrecorded else ""]
        print(f"{app}: removed {len(stale)} {what} that an earlier run left in {one_line(out)} "
              f"({'; '.join(w for w in why if w)})", file=sys.stderr, flush=True)
    return keep


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _remove_leftovers(out: Path, names: set[str]) -> None:
    """Delete the temporary folders ``.<name>.tmp`` / ``.<name>.old`` of atomic writes cut short, for ``names``."""
    for entry in os.scandir(out):
        name = entry.name
        if name.startswith(".") and name.endswith(LEFTOVERS) and name[1:-4] in names and entry.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)
