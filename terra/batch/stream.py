"""One engine kept full: samples stream in, each becomes a rollout the moment a slot is free."""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from terra.batch.concurrency import resolve_max_concurrent
from terra.batch.config import BatchSpec
from terra.batch.prepared_sample import PreparedSample, prepare_sample
from terra.batch.writer import SampleWriter
from terra.batch.manifest import sample_error, sample_record
from terra.batch.plan import Item
from terra.generation.rollout import RolloutState
from terra.pipeline import WorldModelPipeline

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

_END = object()  # no more samples


def prefetch(max_concurrent: int) -> int:
    """Samples read and encoded ahead of the engine: enough to refill freed slots without waiting."""
    return max(2, max_concurrent // 4)


class StreamingEngine:
    """Runs samples on one pipeline with at most ``max_concurrent`` rollouts in flight.

    ``emit`` gets one manifest record per sample, ``on_generated`` each sample whose rollout left the engine,
    ``on_frame`` a sample's index and frames so far.
    """

    def __init__(self, pipeline: WorldModelPipeline, config: BatchSpec, emit: Callable[[dict], None],
                 max_concurrent: int, on_generated: Callable[[Item], None] | None = None,
                 refiner: "VideoRefiner | None" = None, on_frame: Callable[[int, int], None] | None = None) -> None:
        self.pipeline, self.config, self.emit = pipeline, config, emit
        self.on_generated, self.on_frame = on_generated, on_frame
        self.refiner = refiner  # decoder=refiner: the writers' decoder
        self.max_concurrent = max_concurrent
        # checked by run_spec; decoding=auto as the pipeline's run chose
        self.sampling = pipeline.backend.as_run(config.run.sampling)
        self._inbox: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue(maxsize=prefetch(max_concurrent))
        self._stopped = threading.Event()
        self._preparer = threading.Thread(target=self._prepare_loop, name="terra-batch-prepare", daemon=True)

    def put(self, item: Item) -> None:
        self._inbox.put(item)

    def end(self) -> None:
        """No more samples: :meth:`run` returns once the queued ones are recorded."""
        self._inbox.put(_END)

    def stop(self) -> None:
        """Make :meth:`run` return soon; rollouts in flight are dropped without a record."""
        self._stopped.set()
        self._inbox.put(_END)

    def _prepare_loop(self) -> None:
        while not self._stopped.is_set():
            item = self._inbox.get()
            if item is _END:
                self._handoff(_END)
                return
            started = time.perf_counter()
            try:
                prepared = prepare_sample(item, self.pipeline, self.config, started)
            except Exception as err:  # noqa: BLE001  (one bad sample must not stop the others)
                self.emit(sample_record(item.sample, "failed", error=sample_error(err), stage="input", seed=item.seed,
                                        seconds=time.perf_counter() - started))
                continue
            self._handoff(prepared)

    def _handoff(self, entry: object) -> None:
        """Put ``entry`` on the ready queue, waiting for room unless the engine has stopped."""
        while not self._stopped.is_set():
            try:
                self._ready.put(entry, timeout=0.2)
                return
            except queue.Full:
                continue

    def run(self) -> None:
        """Drive the engine until :meth:`end` and nothing is in flight (or :meth:`stop`); wait for the writers."""
        backend = self.pipeline.backend
        writer = SampleWriter(self.pipeline, self.config, self.emit, self.sampling, self.refiner)
        active: dict[int, tuple[PreparedSample, RolloutState, float]] = {}  # id(state) -> prepared, state, admitted
        ended = False
        self._preparer.start()
        try:
            while not self._stopped.is_set() and not (ended and not active):
                while not ended and len(active) < self.max_concurrent:
                    try:
                        entry = self._ready.get(block=not active, timeout=0.2)
                    except queue.Empty:
                        break
                    ended = entry is _END
                    if not ended:
                        self._admit(entry, active)
                if not active:
                    continue
                try:
                    finished = backend.poll()
                except Exception as err:  # noqa: BLE001  (the engine failed its rollouts; record them and go on)
                    self._fail_all(active, err)
                    continue
                for done in finished:
                    prepared, state, admitted = active[id(done.state)]
                    if self.on_frame is not None:
                        self.on_frame(prepared.item.sample.index, state.num_generated)
                    if state.finished:
                        del active[id(state)]
                        backend.release(state)
                        writer.submit(prepared, state.generated(), time.perf_counter() - admitted,
                                      state.pass_stats())
                        if self.on_generated is not None:
                            self.on_generated(prepared.item)
                    else:
                        self._next_frame(state, active)
        finally:
            self.stop()
            self._preparer.join(timeout=30)  # a sample being prepared records nothing after the run has returned
            if active:
                backend.cancel([state for _, state, _ in active.values()])
                for _, state, _ in active.values():
                    backend.release(state)
            writer.close()

    def _admit(self, prepared: PreparedSample, active: dict) -> None:
        """Start ``prepared``'s rollout and queue its first frame (a request the backend refuses is recorded)."""
        backend = self.pipeline.backend
        try:
            state = backend.start(prepared.request)
            backend.submit(state, self.sampling)
        except Exception as err:  # noqa: BLE001
            self._failed(prepared, err)
            return
        active[id(state)] = (prepared, state, time.perf_counter())

    def _failed(self, prepared: PreparedSample, err: Exception) -> None:
        self.emit(sample_record(prepared.item.sample, "failed", error=sample_error(err), stage="generate",
                                seed=prepared.item.seed, seconds=time.perf_counter() - prepared.started))

    def _next_frame(self, state: RolloutState, active: dict) -> None:
        """Queue ``state``'s next frame; a frame the backend refuses fails that rollout alone."""
        try:
            self.pipeline.backend.submit(state, self.sampling)
        except Exception as err:  # noqa: BLE001
            prepared, _, _ = active.pop(id(state))
            self.pipeline.backend.release(state)
            self._failed(prepared, err)

    def _fail_all(self, active: dict, err: Exception) -> None:
        """Record every rollout in flight as failed (stage ``generate``) after the engine raised ``err``."""
        backend = self.pipeline.backend
        states = [state for _, state, _ in active.values()]
        backend.cancel(states)
        for prepared, state, _ in active.values():
            backend.release(state)
            self._failed(prepared, err)
        active.clear()


def longest_rollout(items: Iterable[Item]) -> int:
    """Frames generated by the longest rollout of ``items`` (0 for none)."""
    return max((item.num_frames for item in items), default=0)


def run_items(items: Sequence[Item], config: BatchSpec, pipeline: WorldModelPipeline,
              emit: Callable[[dict], None], refiner: "VideoRefiner | None" = None,
              on_frame: Callable[[int, int], None] | None = None) -> None:
    """Run ``items`` on ``pipeline`` in this thread, keeping its engine full; ``emit`` gets one record per item."""
    in_flight = min(resolve_max_concurrent(config, pipeline, longest_rollout(items)), max(1, len(items)))
    engine = StreamingEngine(pipeline, config, emit, in_flight, refiner=refiner, on_frame=on_frame)
    for item in items:
        engine.put(item)
    engine.end()
    engine.run()
