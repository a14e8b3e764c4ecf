"""Where a run's finished drives are measured and written, in the loop's process or beside it."""

from __future__ import annotations

import sys
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, Callable

from tqdm.auto import tqdm

from terra.closedloop.recording.files import manifest_record, write_drive

Emit = Callable[[dict, dict], None]  # (manifest record, the drive's JSON content)


class DriveWriters:
    """Where finished drives are measured and written."""

    def __init__(self, processes: int, emit: Emit) -> None:
        self.emit = emit
        self.pool = ProcessPoolExecutor(processes, mp_context=get_context("spawn")) if processes else None
        self.pending: deque[tuple[Future | None, float, tuple]] = deque()

    def write(self, seconds: float, *args: Any) -> None:
        """Write a drive (``write_drive``'s arguments; ``seconds``: its share of the chunk's time)."""
        future = None
        if self.pool is not None:
            try:
                future = self.pool.submit(write_drive, *args)
            except BrokenProcessPool as err:  # a writer died since the last drive was handed in
                self._fall_back(err)
        self.pending.append((future, seconds, args))
        self.wait(len(self.pending) if self.pool is not None else 0)

    def wait(self, backlog: int) -> None:
        """Emit every drive written so far, in order, waiting until at most ``backlog`` drives are left to write."""
        while self.pending:
            first = self.pending[0][0]
            if first is not None and not first.done():
                if len(self.pending) <= backlog:
                    return
                if self._write_newest_here():
                    continue
            future, seconds, args = self.pending.popleft()
            self._emit(self._written(future, args), seconds)

    def _write_newest_here(self) -> bool:
        """Write the newest drive no writer has begun; False when every drive left has begun."""
        for index in range(len(self.pending) - 1, -1, -1):
            future, seconds, args = self.pending[index]
            if future is None or (not future.done() and not future.cancel()):
                return False  # begun by a writer, and so has every older one (they are taken in order)
            if future.cancelled():
                here: Future = Future()
                try:
                    here.set_result(write_drive(*args))
                except Exception as err:  # raised when its record is emitted, as a writer's would be
                    here.set_exception(err)
                self.pending[index] = (here, seconds, args)
                return True
        return False

    def _written(self, future: Future | None, args: tuple) -> dict:
        if future is not None:
            try:
                return future.result()
            except BrokenProcessPool as err:
                self._fall_back(err)
        return write_drive(*args)

    def _fall_back(self, err: BrokenProcessPool) -> None:
        """A writer died: every drive not yet written is written by this process from now on."""
        tqdm.write(f"terra-drive: warning: a writer process died ({err}); drives are written by the loop's own "
                   "process from now on", file=sys.stderr)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = None
        self.pending = deque((None, seconds, args) for _, seconds, args in self.pending)

    def _emit(self, content: dict, seconds: float) -> None:
        self.emit(manifest_record(content, content["status"], seconds), content)

    def __enter__(self) -> "DriveWriters":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=exc[0] is None, cancel_futures=exc[0] is not None)
