"""Atomic writes: write to a temporary file (or folder) beside the target, then ``os.replace`` it."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from terra.core.errors import TerraInputError

MARKER = ".terra-output.json"  # in a folder: the names of what the toolkit wrote there, and which app owns it
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a full quota, a file-size limit (ulimit -f)


def write_failed(path: str | os.PathLike, err: OSError) -> TerraInputError:
    """The one line of a write to ``path`` that failed with ``err`` (no space, a file too large, not writable)."""
    return TerraInputError(f"cannot write {path} ({err.strerror or err}); free disk space or choose another output "
                           "folder")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` (same suffix, so writers pick the right format)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path.parent)
    fd, tmp_path = None, None
    try:
        while fd is None:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.{_owner()}.", suffix=f".tmp{path.suffix}",
                                       dir=path.parent)
            tmp_path = Path(tmp)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held while it is written: no other process's sweep removes it
            except OSError:  # a file system without locks: no sweep can take the lock either
                break
            if not _names(fd, tmp):  # removed before it was locked (a sweep that took it for a dead writer's)
                os.close(fd)
                fd = None
        yield tmp_path
        tmp_path.chmod(0o644)  # mkstemp creates 0600 (and some writers recreate the file); outputs are shared
        os.replace(tmp_path, path)
    except OSError as err:  # the writer's, inside the block, too
        if err.errno in NO_SPACE:
            raise write_failed(path, err) from None
        raise
    finally:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)


def _names(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except OSError:
        return False


def _owner() -> str:
    """``<host>-<pid>``: whose a temporary file is (the host name reduced to letters, digits and ``-``)."""
    return f"{re.sub(r'[^A-Za-z0-9-]', '-', socket.gethostname())[:64] or 'host'}-{os.getpid()}"


# atomic_path's temporary names: ".<stem>.<host>-<pid>.<8 of mkstemp's characters>.tmp<suffix>" beside the target
_TEMPORARY = re.compile(r"^\.(?P<stem>.+)\.(?P<host>[A-Za-z0-9-]{1,64})-(?P<pid>[1-9][0-9]*)\.[a-z0-9_]{8}"
                        r"\.tmp(?P<suffix>\.[^.]*)?$")
_swept: set[tuple[str, int]] = set()  # (folder, pid): each process sweeps a folder once


def temporary_target(name: str) -> str | None:
    """The name of the file whose :func:`atomic_path` temporary is named ``name``; None for a name of any other form."""
    match = _TEMPORARY.match(name)
    return None if match is None else match["stem"] + (match["suffix"] or "")


def _gone(pid: int) -> bool:
    """Whether no process of this ``pid`` runs on this host (one of another user's still runs: not gone)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def remove_abandoned(path: str | os.PathLike) -> bool:
    """Delete the temporary file ``path`` if no process holds its lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its writer holds it
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _names(fd, os.fspath(path)):
            return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep_stale(folder: str | os.PathLike) -> None:
    """Remove temporary files in a marked ``folder`` that a killed writer of this host left."""
    key = (os.path.abspath(folder), os.getpid())
    if key in _swept:
        return
    _swept.add(key)
    if not (Path(folder) / MARKER).is_file():
        return
    listed, host = marked(folder) | {MARKER}, _owner().rsplit("-", 1)[0]
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match and match["host"] == host and temporary_target(entry.name) in listed and _gone(int(match["pid"])):
            remove_abandoned(entry.path)


def written(folder: str | os.PathLike, names: Iterable[str]) -> dict[str, list]:
    """Each file's ``[size, SHA-256]`` as written into ``folder`` (a folder's: its files', by name inside it)."""
    root, sizes = Path(folder), {}
    for name in names:
        path = root / name
        for file in sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]:
            with open(file, "rb") as fh:
                sizes[file.relative_to(root).as_posix()] = [os.fstat(fh.fileno()).st_size,
                                                            hashlib.file_digest(fh, "sha256").hexdigest()]
    return sizes


def whole_files(folder: str | os.PathLike, names: Any, kept: Any) -> bool:
    """Whether ``folder`` holds every one of ``names`` as ``kept`` recorded it when written."""
    if not isinstance(names, list) or not isinstance(kept, dict) or not all(isinstance(n, str) for n in names):
        return False
    try:
        now = written(folder, names)
    except OSError:
        return False
    return bool(now) == bool(names) and now == kept


def _finite(value):
    """``value`` with every non-finite float (NaN, infinities) replaced by None, in dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(value, indent: int | None = None, **options) -> str:
    """``value`` as strict JSON text (no NaN or Infinity: such numbers become ``null``)."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False, **options)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_dir(path: str | os.PathLike, app: str | None = None) -> Iterator[Path]:
    """Yield a fresh, empty temporary folder next to ``path``; on normal exit it takes ``path``'s place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing
    tmp.mkdir(parents=True)
    try:
        yield tmp
        mark(tmp, [entry.name for entry in os.scandir(tmp) if entry.name != MARKER], app or owner(path))
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError) and err.errno in NO_SPACE:
            raise write_failed(path, err) from None
        raise
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def _marker(folder: str | os.PathLike) -> dict:
    """``folder``'s :data:`MARKER` as a dict (empty without a marker, or with one that is not the toolkit's JSON)."""
    try:
        content = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def marked(folder: str | os.PathLike) -> frozenset[str]:
    """The names ``folder``'s :data:`MARKER` lists (none without a valid marker)."""
    names = _marker(folder).get("names")
    return frozenset(n for n in names if isinstance(n, str)) if isinstance(names, list) else frozenset()


def owner(folder: str | os.PathLike) -> str | None:
    """The app (console script) whose run folder ``folder`` is, as its :data:`MARKER` says."""
    app = _marker(folder).get("app")
    return app if isinstance(app, str) and app else None


def mark(folder: str | os.PathLike, names: Iterable[str], app: str | None = None) -> None:
    """Add ``names`` to ``folder``'s :data:`MARKER` and record ``app`` as owner (None: unchanged), atomically."""
    folder = Path(folder)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # shards of one batch run may share a folder
        listed, names, was = marked(folder), set(names), owner(folder)
        app = app or was
        if not names <= listed or app != was or not (folder / MARKER).is_file():  # a rerun rewrites nothing
            content = {"written_by": "terra-world-model", **({"app": app} if app else {}),
                       "names": sorted(listed | set(names))}
            write_text(folder / MARKER, json_text(content) + "\n")
    finally:
        os.close(fd)
