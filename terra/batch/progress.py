"""A batch run's progress: a tqdm bar over generated frames and one over written samples (log lines off a terminal)."""

from __future__ import annotations

import threading
from typing import Sequence

from terra.batch.plan import Item
from terra.config.manifest import count_statuses
from terra.core.progress import Progress


class BatchProgress:
    """The two bars of a run over ``items``; ``enabled=False`` shows nothing (``progress=false``). Thread-safe."""

    def __init__(self, items: Sequence[Item], enabled: bool = True) -> None:
        self._frames_of = {item.sample.index: item.num_frames for item in items}
        self._done: dict[int, int] = {}  # sample index -> frames generated so far (while not yet recorded)
        self._recorded: set[int] = set()
        self._lock = threading.Lock()
        self.frames_total = sum(self._frames_of.values())
        self.frames_done = 0
        common = {"enabled": enabled, "dynamic_ncols": True, "smoothing": 0.1}
        self.frames = Progress(self.frames_total, "generated frames", "frame", position=0, **common)
        self.samples = Progress(len(items), "samples written", "sample", lines=False, position=1, **common)

    def generated(self, index: int, count: int) -> None:
        """Sample ``index`` has ``count`` frames generated so far (0: it starts again)."""
        with self._lock:
            if index in self._recorded or index not in self._frames_of:
                return  # a late report of a sample already recorded
            self._add(count - self._done.get(index, 0))
            self._done[index] = count

    def _add(self, frames: int) -> None:
        self.frames_done += frames
        self.frames.update(frames)

    def recorded(self, record: dict, records: Sequence[dict]) -> None:
        """A sample's manifest ``record`` was written (``records``: all so far, for the counts)."""
        with self._lock:
            index = record.get("index")
            full = self._frames_of.get(index)
            if full is not None and index not in self._recorded:
                self._recorded.add(index)
                done = self._done.pop(index, 0)
                if record["status"] == "ok":
                    self._add(full - done)
                else:  # its frames will never come: the ETA is for the others
                    self.frames_total -= full - done
                    self.frames.set_total(self.frames_total)
            counts = count_statuses(records)
            self.samples.set_postfix({"ok": counts["ok"], "failed": counts["failed"]}, refresh=False)
            self.samples.update(1)

    def close(self) -> None:
        self.frames.close()
        self.samples.close()
