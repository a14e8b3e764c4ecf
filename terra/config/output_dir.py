"""Every app's output folder, checked before any work: apart from its inputs, one app's, replacing only what
the toolkit wrote."""

from __future__ import annotations

import fnmatch
import glob
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from terra.config.checks import one_line, shown
from terra.config.manifest import manifest_app
from terra.core.atomic import MARKER, mark, marked, owner
from terra.core.errors import TerraInputError
from terra.core.lock import output_lock

Inputs = Iterable[tuple[str, "str | os.PathLike | Iterable[str | os.PathLike] | None"]]
MIN_FREE_BYTES = 1 << 20  # an output folder's disk needs at least this much room before any work starts
ATOMIC_EXTRA = len(".") + len(".XXXXXXXX.tmp")  # atomic writes go through ".<stem>.<8 chars>.tmp<suffix>"


@dataclass(frozen=True)
class OutputDir:
    """An output folder that passed :func:`claim_output_dir`: where, under which setting, what the run writes."""

    path: Path  # absolute
    setting: str  # the setting that named it, for error lines (output_dir, output.dir, ...)
    names: tuple[str, ...]  # file-name patterns the run writes in it (recorded in its marker)
    app: str | None = None  # the app that owns the folder (recorded in its marker); None: a single file's folder

    def record(self) -> None:
        """Create the folder and record the run's names and app in its marker (pattern names by their writers)."""
        self.path.mkdir(parents=True, exist_ok=True)
        mark(self.path, [name for name in self.names if not glob.has_magic(name)], self.app)

    @contextmanager
    def hold(self, main_file: str) -> Iterator[Path]:
        """For the block: the folder's lock (``main_file`` names ``.<stem>.lock``), the folder created, the names
        recorded.

        A folder this call created that holds only the marker at the end is removed.
        """
        existed = self.path.is_dir()
        with output_lock(self.path / main_file, self.setting) as lock:
            self.record()
            try:
                yield self.path
            finally:
                if not existed:
                    unmark_unused(self.path, lock.name)  # the lock then removes the empty folder


def unmark_unused(folder: Path, *also: str) -> None:
    """Remove ``folder``'s marker when nothing else (besides ``also``) is in it."""
    if folder.is_dir() and {entry.name for entry in os.scandir(folder)} <= {MARKER, *also}:
        (folder / MARKER).unlink(missing_ok=True)


def claim_output_dir(path: str | os.PathLike, setting: str, files: Iterable[str] = (), folders: Iterable[str] = (),
                     whole: Iterable[str] = (), inputs: Inputs = (), replaced: bool = False, *,
                     app: str) -> OutputDir:
    """Check output folder ``path`` (named by ``setting``) for a run of ``app`` before any work; nothing is created.

    Args:
        files: fnmatch patterns of the files the run writes; existing matches must be listed in the marker.
        folders: patterns of the sub-folders the run writes into.
        whole: sub-folders the run replaces whole. replaced: the run replaces the folder itself.
        inputs: ``(what, path or glob or paths)`` the run reads.
    """
    files, folders, whole = tuple(files), tuple(folders), tuple(whole)
    names = files + folders + whole
    folder = check_output_dir(path, [n for n in names if not glob.has_magic(n)], setting)
    for what, given in inputs:
        for item in _paths(given):
            check_apart(folder, setting, what, item)
    where = f"{setting}={one_line(folder)}"
    other = folder_owner(folder)
    if other is not None and other != app:
        raise TerraInputError(f"{where} holds the outputs of {other}, which {app} would write over or mix with; "
                              f"give {app} a folder of its own (another {setting})")
    if replaced:
        _check_replaceable(folder, setting, where)
    elif folder.is_dir():
        foreign, misplaced, listed = [], [], marked(folder)
        kinds_of = (("file", *_split(files)), ("folder", *_split(folders + whole)))
        for entry in os.scandir(folder):
            kinds = [kind for kind, exact, patterns in kinds_of
                     if entry.name in exact or any(fnmatch.fnmatchcase(entry.name, p) for p in patterns)]
            if not kinds or entry.name == MARKER:
                continue
            if (entry.is_dir() and "folder" not in kinds) or (not entry.is_dir() and "file" not in kinds):
                misplaced.append((shown(entry.name, 60), "a folder" if entry.is_dir() else "a file",
                                  "a file" if entry.is_dir() else "a folder"))
            elif entry.name not in whole and entry.name not in listed:
                foreign.append(entry.name)
        if misplaced:
            name, found, wanted = misplaced[0]
            raise TerraInputError(f"{where} holds {found} {name} where the run writes {wanted} of that name; move "
                                  f"it away or choose another {setting}")
        if foreign:
            raise TerraInputError(
                f"{where} holds {_listed(foreign)}, which this run would overwrite and which the toolkit did not "
                f"write there; move {'it' if len(foreign) == 1 else 'them'} away or choose another {setting}")
        for name in whole:
            _check_replaceable(folder / name, setting, f"{where}: {name}/")
    return OutputDir(folder, setting, names, app)


def folder_owner(folder: Path) -> str | None:
    """The app whose run folder ``folder`` is (marker, else its manifest); None for a folder of no app's."""
    recorded = owner(folder)
    if recorded is not None:
        return recorded
    manifests = sorted(name for name in marked(folder) if name.endswith(".jsonl"))
    return next((app for app in map(manifest_app, (folder / name for name in manifests)) if app), None)


def _split(names: tuple[str, ...]) -> tuple[frozenset[str], list[str]]:
    return frozenset(n for n in names if not glob.has_magic(n)), [n for n in names if glob.has_magic(n)]


def claim_output_file(path: str | os.PathLike, setting: str, inputs: Inputs = (), *, app: str) -> OutputDir:
    """:func:`claim_output_dir` for a run of ``app`` writing the one file ``path``; it shares its folder."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    for what, given in inputs:
        for item in _paths(given):
            check_apart(path, setting, what, item)
    return replace(claim_output_dir(path.parent, setting, files=[path.name], app=app), app=None)


def _paths(given) -> list[Path]:
    """An input as paths: one path, a glob's matches, or a list of them."""
    if given is None:
        return []
    if isinstance(given, (str, os.PathLike)):
        text = os.path.expanduser(str(given))
        matches = glob.glob(text) if glob.has_magic(text) and not os.path.lexists(text) else [text]
        return [Path(m) for m in matches]
    return [p for item in given for p in _paths(item)]


def check_apart(folder: Path, setting: str, what: str, given: str | os.PathLike) -> None:
    """Refuse output ``folder`` when it is, holds or lies inside input ``given``; links are followed."""
    real, inp = Path(os.path.realpath(folder)), Path(os.path.realpath(given))
    where = f"{setting}={one_line(folder)}"
    if real == inp:
        raise TerraInputError(f"{where} is the {what} ({one_line(given)}), which the run reads; write the outputs to "
                              "another folder")
    if inp in real.parents:
        raise TerraInputError(f"{where} lies inside the {what} {one_line(given)}, which the run reads; write the "
                              "outputs to a folder outside it")
    if real in inp.parents:
        raise TerraInputError(f"{where} holds the {what} {one_line(given)}, which the run reads and its outputs could "
                              f"overwrite; choose another {setting} or move the input out of it")


def _check_replaceable(folder: Path, setting: str, shown_as: str) -> None:
    """Refuse to replace ``folder`` whole unless it is not there, empty, or holds only what its marker lists."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise TerraInputError(f"{shown_as} is a file, not a folder; choose another {setting}")
    entries = [entry.name for entry in os.scandir(folder) if entry.name != MARKER]
    if not entries:
        return
    listed = marked(folder)
    if not listed:
        raise TerraInputError(f"{shown_as} holds files the toolkit did not write ({_listed(entries)}), which "
                              f"writing there would delete; move them away or choose another {setting}")
    foreign = [name for name in entries if name not in listed]
    if foreign:
        raise TerraInputError(f"{shown_as} holds {_listed(foreign)} beside what the toolkit wrote there, which "
                              f"rewriting the folder would delete; move {'it' if len(foreign) == 1 else 'them'} "
                              f"away or choose another {setting}")


def _listed(names: list[str]) -> str:
    """Up to three names, shown escaped, and how many more."""
    names = sorted(names)
    text = ", ".join(shown(n, 60) for n in names[:3])
    return text + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def _file_system(path: str | os.PathLike) -> tuple[Path, Path, int, int]:
    """``path`` absolute, its deepest existing ancestor, and that file system's ``NAME_MAX`` and ``PATH_MAX``."""
    folder = Path(os.path.abspath(Path(path).expanduser()))
    existing = folder
    while not os.path.lexists(existing):
        existing = existing.parent
    return folder, existing, _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)


def check_output_dir(path: str | os.PathLike, file_names: Iterable[str] = (), setting: str = "output.dir") -> Path:
    """Check that folder ``path`` can be created or written and ``file_names`` fit its file system; return it absolute.
    """
    folder, existing, name_max, path_max = _file_system(path)
    if not existing.is_dir():
        raise TerraInputError(f"output folder {path} is not writable ({existing} is not a folder); "
                              f"choose another {setting}")
    parts = [(p, 0) for p in folder.relative_to(existing).parts] + [(n, ATOMIC_EXTRA) for n in file_names]
    for name, extra in parts:
        size = len(os.fsencode(name)) + extra
        if size > name_max:
            what = "the output file name" if extra else "the folder name"
            fix = "a shorter output.name" if extra else f"a shorter {setting}"
            raise TerraInputError(f"{what} {shown(name)} is too long: {size} bytes"
                                  f"{' with its temporary suffix' * bool(extra)}, more than the file system allows "
                                  f"({name_max}); choose {fix}")
    longest = max([len(os.fsencode(n)) + ATOMIC_EXTRA for n in file_names] or [0])
    if len(os.fsencode(str(folder))) + 1 + longest > path_max:
        raise TerraInputError(f"output folder {shown(str(path))} makes paths longer than the file system allows "
                              f"({path_max} bytes); choose a shorter {setting}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TerraInputError(f"output folder {path} is not writable ({existing} cannot be written); "
                              f"choose another {setting}")
    usage = shutil.disk_usage(existing)
    if usage.total == 0:  # /proc, /sys: a kernel interface, not storage
        raise TerraInputError(f"output folder {path} is not on a disk ({existing} is on a virtual file system that "
                              f"holds no files); choose another {setting}")
    free = usage.free
    if free < MIN_FREE_BYTES:
        raise TerraInputError(f"output folder {path} is on a full disk ({free >> 10} KiB free); free some space "
                              f"or choose another {setting}")
    return folder


def check_output_names(folder: str | os.PathLike, names: Iterable[str], what: str = "output file") -> None:
    """Raise unless each of ``names`` (relative to ``folder``) fits the file system: no NUL, within the name limits."""
    base, _, name_max, path_max = _file_system(folder)
    for name in names:
        try:
            encoded = os.fsencode(name)
        except UnicodeEncodeError:
            raise TerraInputError(f"{what} name {shown(name)} is not valid text (a lone surrogate escape)") from None
        if b"\0" in encoded:
            raise TerraInputError(f"{what} name {shown(name)} holds a NUL character")
        parts = Path(name).parts
        for i, part in enumerate(parts):
            size = len(os.fsencode(part)) + (ATOMIC_EXTRA if i == len(parts) - 1 else 0)
            if size > name_max:
                raise TerraInputError(f"{what} name {shown(part)} is too long: {size} bytes with its temporary "
                                      f"suffix, more than the file system allows ({name_max})")
        if len(os.fsencode(str(base))) + 1 + len(encoded) + ATOMIC_EXTRA > path_max:
            raise TerraInputError(f"{what} {shown(name)} makes a path longer than the file system allows "
                                  f"({path_max} bytes) in {shown(str(base))}")
