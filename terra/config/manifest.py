"""A recorded run's manifest (one JSON record per item, appended as it finishes), its summary, and their names."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable, Iterable

from terra.core.atomic import NO_SPACE, json_text, write_failed
from terra.decoder.sidecar import to_jsonable

MANIFEST = "manifest.jsonl"
STATUSES = ("ok", "failed", "skipped")  # skipped: already complete, kept from an earlier run
# The field that names a record's item, and the app whose records name their items so.
RECORD_OWNERS = (("drive", "terra-drive"), ("sample_id", "terra-rollout"))


def manifest_name(name: str = MANIFEST, shard_index: int = 0, num_shards: int = 1) -> str:
    """``name``, or for shard ``shard_index`` of ``num_shards`` ``<stem>.shard-<i>-of-<n>.jsonl``."""
    return name if num_shards == 1 else f"{name[: -len('.jsonl')]}.shard-{shard_index}-of-{num_shards}.jsonl"


def summary_name(manifest: str) -> str:
    """``manifest.jsonl`` -> ``manifest.summary.json`` (a shard's alike)."""
    return manifest[: -len(".jsonl")] + ".summary.json"


class Manifest:
    """A run's manifest: JSONL records appended atomically (``O_APPEND``, fsynced) from any thread.

    Records that arrive after :meth:`close` are dropped.
    """

    def __init__(self, path: Path, on_record: Callable[[dict], None] | None = None) -> None:
        self.path = path
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self.on_record = on_record  # called (under the lock) after each record is written
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
                                       0o644)
        self._torn = False  # the last write stopped mid-line

    def add(self, record: dict) -> None:
        """Append ``record`` to the file (synced at once) and to :attr:`records`."""
        line = (json_text(to_jsonable(record)) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                return
            self.records.append(record)  # counted even when a full disk keeps it from the file
            try:
                self._append(b"\n" + line if self._torn else line)
            finally:
                if self.on_record is not None:
                    self.on_record(record)

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view)
            except OSError as err:
                self._torn = len(view) < len(data)
                if err.errno in NO_SPACE:
                    raise write_failed(self.path, err) from None
                raise
            view = view[written:]
        self._torn = False
        os.fsync(self._fd)

    def close(self) -> None:
        """Close the file; later records are dropped."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def read_manifest(path: str | os.PathLike) -> list[dict]:
    """Records of a manifest; a torn last line (a killed run) is ignored."""
    records = []
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(raw))
        except ValueError:
            continue
    return records


def count_statuses(records: Iterable[dict]) -> dict[str, int]:
    """How many records have each status (every one of :data:`STATUSES` present, zero included)."""
    counts = {status: 0 for status in STATUSES}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    return counts


def manifest_app(path: str | os.PathLike) -> str | None:
    """The app that wrote the manifest at ``path`` (by its first record's shape), or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            first = json.loads(handle.readline(1 << 20))
    except (OSError, ValueError):
        return None
    return next((app for key, app in RECORD_OWNERS if isinstance(first, dict) and key in first), None)
