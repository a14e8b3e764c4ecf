"""The Ray actor of ``executor=ray``: one pipeline whose engine is kept full by streaming samples."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import ray

from terra.batch.concurrency import max_rollouts, resolve_max_concurrent
from terra.batch.config import BatchSpec
from terra.batch.manifest import sample_error
from terra.batch.plan import Item
from terra.batch.stream import StreamingEngine, prefetch
from terra.models import LlamaActionConfig
from terra.pipeline import WorldModelPipeline, actor_spec
from terra.run import resolve_run


class RolloutActor:
    """One engine on the actor's GPU(s) or CPU; start-up failures are reported by :meth:`info`, not raised."""

    def __init__(self, config: BatchSpec, model_config: LlamaActionConfig, longest: int) -> None:
        self.error: str | None = None
        self.max_concurrent = 0
        self.gpus = [str(g) for g in ray.get_gpu_ids()]
        self.device: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generated: dict[int, asyncio.Future] = {}  # sample index -> resolved when its rollout left the engine
        self._records: dict[int, asyncio.Future] = {}  # sample index -> resolved with its manifest record
        self._frames: dict[int, int] = {}  # sample index -> frames generated so far, until its record is taken
        self._lock = threading.Lock()
        try:
            self._start(config, model_config, longest)
        except Exception as err:  # noqa: BLE001  (reported by info(), which the driver calls first)
            self.error = sample_error(err)

    def _start(self, config: BatchSpec, model_config: LlamaActionConfig, longest: int) -> None:
        # this actor's run resolved once with the driver's model config, its decoding chosen for its rollouts in flight
        spec = actor_spec(config.run, self.gpus)
        self.device = spec.device
        most = max_rollouts(config, spec)
        run = resolve_run(spec, most, model_config, max_rollouts=most)
        self.pipeline = WorldModelPipeline.from_run(run)
        self.max_concurrent = resolve_max_concurrent(config, self.pipeline, longest)
        self.engine = StreamingEngine(self.pipeline, config, self._emit, self.max_concurrent,
                                      on_generated=self._left_engine,
                                      refiner=None if run.refiner is None else run.refiner.load(),
                                      on_frame=self._frame)
        threading.Thread(target=self._drive, name="terra-batch-engine", daemon=True).start()

    def _drive(self) -> None:
        """Run the engine loop; on failure end the process so Ray restarts the actor."""
        try:
            self.engine.run()
        except BaseException as err:  # noqa: BLE001
            print(f"terra batch actor: the engine stopped ({sample_error(err)}); exiting for Ray to restart it",
                  file=sys.stderr, flush=True)
            os._exit(1)

    def info(self) -> dict:
        """Where this actor runs and how many samples it wants outstanding (``error``: why it could not start)."""
        return {"node": ray.util.get_node_ip_address(), "pid": os.getpid(), "gpus": self.gpus, "device": self.device,
                "max_concurrent": self.max_concurrent, "depth": self.max_concurrent + prefetch(self.max_concurrent),
                "error": self.error}

    async def run(self, item: Item) -> int:
        """Queue ``item``; return its index once its rollout has left the engine (generated, or failed before)."""
        if self.error is not None:
            raise RuntimeError(f"the actor could not start: {self.error}")
        self._loop = asyncio.get_running_loop()
        index = item.sample.index
        generated, record = self._loop.create_future(), self._loop.create_future()
        with self._lock:
            self._generated[index], self._records[index] = generated, record
        self.engine.put(item)
        await generated
        return index

    async def record(self, index: int) -> dict | None:
        """The sample's manifest record once its files are written; None when this actor no longer holds it."""
        with self._lock:
            record = self._records.get(index)
        if record is None:
            return None
        try:
            return await record
        finally:
            with self._lock:
                self._records.pop(index, None)
                self._frames.pop(index, None)

    def progress(self) -> dict[int, int]:
        """Frames generated so far per sample held here."""
        with self._lock:
            return dict(self._frames)

    def _frame(self, index: int, count: int) -> None:
        with self._lock:
            self._frames[index] = count

    def _left_engine(self, item: Item) -> None:
        """The engine handed ``item``'s rollout to the writers: its :meth:`run` call returns."""
        with self._lock:
            future = self._generated.pop(item.sample.index, None)
        self._resolve(future, None)

    def _emit(self, record: dict) -> None:
        """A record from the engine or a writer thread resolves the sample's pending calls."""
        with self._lock:
            generated = self._generated.pop(record["index"], None)
            future = self._records.get(record["index"])
        self._resolve(generated, None)
        self._resolve(future, record)

    def _resolve(self, future: asyncio.Future | None, value: object) -> None:
        """Set ``future``'s result on the actor's event loop (from any thread)."""
        if future is not None:
            self._loop.call_soon_threadsafe(lambda: future.done() or future.set_result(value))
