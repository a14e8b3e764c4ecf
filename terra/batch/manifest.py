"""The manifest of a batch run: one JSON record per sample, appended as the sample finishes.

Record fields are listed in terra/batch/__init__.py ("Outputs").
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from decoder.sidecar import to_jsonable
from terra.batch.samples import Sample
from terra.errors import TerraInputError

STATUSES = ("ok", "failed", "skipped")


def sample_record(sample: Sample, status: str, *, error: str | None = None, stage: str | None = None,
                  seconds: float | None = None, seed: int | None = None, files: Sequence[str] = (),
                  **extra: Any) -> dict:
    """The manifest record of ``sample`` with ``status`` (one of :data:`STATUSES`); ``extra`` adds fields."""
    record = {
        "sample_id": sample.sample_id, "line": sample.line, "file": sample.file, "index": sample.index,
        "status": status, "stage": stage, "error": error,
        "seconds": None if seconds is None else round(seconds, 3), "seed": seed, "files": list(files),
        "finished_at": round(time.time(), 3),  # Unix time; with seconds, when the sample's work ran
    }
    label = None if sample.record is None else sample.record.get("label")
    if label is not None:
        record["label"] = label
    record.update(extra)
    return record


def one_line(err: BaseException) -> str:
    """An exception as one line (user errors keep their message; others get their type name)."""
    text = " ".join(str(err).split())
    if isinstance(err, TerraInputError):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class Manifest:
    """The run's manifest: JSONL records appended (and flushed) as samples finish; thread-safe."""

    def __init__(self, path: Path, on_record: Callable[[dict], None] | None = None) -> None:
        self.path = path
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self.on_record = on_record  # called (under the lock) after each record is written
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "w", encoding="utf-8")

    def add(self, record: dict) -> None:
        """Append ``record`` to the file (flushed at once) and to :attr:`records`."""
        with self._lock:
            self.records.append(record)
            self._fh.write(json.dumps(to_jsonable(record)) + "\n")
            self._fh.flush()
            if self.on_record is not None:
                self.on_record(record)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._fh.close()


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
