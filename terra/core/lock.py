"""One run per output folder (per shard of a batch run): a ``filelock`` lock file inside the folder, naming its
holder."""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from terra.core.errors import TerraInputError
from terra.core.folders import missing_folders, remove_empty_folders

NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)  # a file system that cannot lock


def lock_path(manifest_path: str | os.PathLike) -> Path:
    """The lock file of the run that writes ``manifest_path`` (its main file): ``.<stem>.lock`` beside it."""
    manifest = Path(manifest_path)
    return manifest.with_name(f".{manifest.stem}.lock")


def _holder(path: Path) -> str:
    """``pid 12 on host h since 2026-01-01 10:00:00 UTC`` from a lock file's content (or a vaguer phrase)."""
    try:
        info = json.loads(path.read_text("utf-8"))
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["started_at"])))
        return f"pid {int(info['pid'])} on host {info['host']} since {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that is starting"


def _write_holder(fd: int) -> None:
    """Say who holds the lock (advisory: a full disk leaves the file empty and the lock held)."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": round(time.time(), 3)}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
    except OSError:
        pass


def _acquire(path: Path, setting: str) -> FileLock:
    """``path`` locked (created if needed, with its folder), or one line naming the run that holds it."""
    while True:
        lock = FileLock(path, blocking=False, fallback_to_soft=False, on_acquired=_write_holder)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            return lock
        except FileNotFoundError:  # the folder was removed by a run that just finished: make it again
            continue
        except Timeout:
            holder = _holder(path)
            if not path.exists():  # its holder just finished and removed it
                continue
            raise TerraInputError(f"output folder {path.parent} is in use by another run ({holder}; lock "
                                  f"file {path.name}); wait for it to finish or choose another {setting}") from None
        except OSError as err:
            if err.errno in NO_FLOCK:
                raise TerraInputError(f"output folder {path.parent} cannot be locked ({err.strerror}); choose "
                                      f"another {setting} on a local or lock-capable file system") from None
            raise TerraInputError(f"output folder {path.parent} cannot hold the run's lock file {path.name} "
                                  f"({err.strerror}); choose another {setting}") from None


@contextmanager
def output_lock(manifest_path: str | os.PathLike, setting: str = "output.dir") -> Iterator[Path]:
    """Hold the lock of the run that writes ``manifest_path`` (its folder created if needed) for the block."""
    path = Path(os.path.abspath(lock_path(manifest_path)))
    created = missing_folders(path.parent)
    try:
        lock = _acquire(path, setting)
    except BaseException:
        remove_empty_folders(created)
        raise
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)  # while still locked: a run that opened this file gives way to a new one
        lock.release()
        remove_empty_folders(created)
