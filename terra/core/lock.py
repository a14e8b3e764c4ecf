"""One run per output folder (per shard of a batch run): an exclusive ``flock`` on a lock file inside the folder."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from terra.core.errors import TerraInputError
from terra.core.folders import missing_folders, remove_empty_folders


def lock_path(manifest_path: str | os.PathLike) -> Path:
    """The lock file of the run that writes ``manifest_path`` (its main file): ``.<stem>.lock`` beside it."""
    manifest = Path(manifest_path)
    return manifest.with_name(f".{manifest.stem}.lock")


def _holder(fd: int) -> str:
    """``pid 12 on host h since 2026-01-01 10:00:00 UTC`` from a lock file's content (or a vaguer phrase)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["started_at"])))
        return f"pid {int(info['pid'])} on host {info['host']} since {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that is starting"


def _acquire(path: Path, setting: str) -> int:
    """Open and lock ``path`` (created if needed, with its folder); the locked descriptor."""
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the folder was removed by a run that just finished: make it again
            continue
        except OSError as err:
            raise TerraInputError(f"output folder {path.parent} cannot hold the run's lock file {path.name} "
                                  f"({err.strerror}); choose another {setting}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise TerraInputError(f"output folder {path.parent} is in use by another run ({holder}; lock "
                                  f"file {path.name}); wait for it to finish or choose another {setting}") from None
        except OSError as err:
            os.close(fd)
            raise TerraInputError(f"output folder {path.parent} cannot be locked ({err.strerror}); choose another "
                                  f"{setting} on a local or lock-capable file system") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the file was deleted by its previous holder after we opened it: take the new one


def _write_holder(fd: int) -> None:
    """Say who holds the lock (advisory: a full disk leaves the file empty and the lock held)."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": round(time.time(), 3)}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
    except OSError:
        pass


@contextmanager
def output_lock(manifest_path: str | os.PathLike, setting: str = "output.dir") -> Iterator[Path]:
    """Hold the lock of the run that writes ``manifest_path`` (its folder created if needed) for the block."""
    path = Path(os.path.abspath(lock_path(manifest_path)))
    created = missing_folders(path.parent)
    try:
        fd = _acquire(path, setting)
    except BaseException:
        remove_empty_folders(created)
        raise
    _write_holder(fd)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)  # while still locked, so no second run locks a deleted file
        os.close(fd)
        remove_empty_folders(created)
