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

from terra.core.atomic import json_text
from terra.core.errors import error_line
from terra.decoder.sidecar import to_jsonable
from terra.inputs.samples import Sample

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


# What frees memory in a batch run: the tokenizer and the writers share the GPU with the engine, whose vLLM KV cache
# takes gpu_memory_utilization of it (tests/batch/test_batch_hostile.py).
MEMORY_ADVICE = ("lower backend.options.gpu_memory_utilization (vLLM's share beside the engine), writer_threads or "
                 "max_concurrent")


def sample_error(err: BaseException) -> str:
    """A sample's failure as its manifest record's one-line ``error`` (terra/core/errors.py, ``error_line``), a
    lack of memory answered with the batch's settings that free it."""
    return error_line(err, memory_advice=MEMORY_ADVICE)


class Manifest:
    """The run's manifest: JSONL records appended as samples finish, from any thread.

    Each record is one ``write()`` of a complete line to a file opened with ``O_APPEND``, under a lock, then
    fsynced: a record is either whole in the file or absent, never spliced into another (a write cut short,
    e.g. by a full disk, is ended with a newline first, so the next record starts a line of its own). Records
    that arrive after :meth:`close` (a helper thread finishing after an interrupt) are dropped.
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
            except OSError:
                self._torn = len(view) < len(data)
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
