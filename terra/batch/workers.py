"""Multi-GPU batch runs: one spawned worker process per GPU (or group of ``tensor_parallel_size`` GPUs), each
with its own engine and every n-th pending sample; records come back to the parent, which alone writes the
manifest.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
from multiprocessing.queues import Queue
from typing import Callable

import torch

from terra.batch.config import BatchConfig
from terra.batch.engine import build_pipeline, run_items, set_threads
from terra.batch.manifest import one_line, sample_record
from terra.batch.plan import Item
from terra.errors import TerraInputError
from terra.models import LlamaActionConfig


def gpu_groups(config: BatchConfig) -> list[list[str]] | None:
    """GPU id groups, one per worker process, or None to run in this process."""
    if config.gpus is None and config.num_gpus in (0, 1):
        return None
    visible = torch.cuda.device_count()
    if config.gpus is not None:
        gpus = [str(g) for g in (config.gpus if isinstance(config.gpus, (list, tuple)) else [config.gpus])]
        if not gpus:
            return None
    else:
        count = visible if config.num_gpus == -1 else config.num_gpus
        if visible == 0 or count > visible:
            raise TerraInputError(f"num_gpus={config.num_gpus} but {visible} CUDA GPU(s) are visible; "
                                  "use num_gpus=1 (or 0 for CPU) or list GPUs with gpus=[0,1]")
        gpus = [str(i) for i in range(count)]
    if visible == 0:
        raise TerraInputError(f"gpus={gpus} but no CUDA GPU is visible; drop gpus= to run on this machine's CPU")
    if not str(config.device).startswith(("auto", "cuda")):
        raise TerraInputError(f"device={config.device} cannot be combined with num_gpus/gpus; use device=auto")
    tp = int(dict(config.backend_options).get("tensor_parallel_size", 1) or 1)
    if len(gpus) % tp:
        raise TerraInputError(f"{len(gpus)} GPU(s) cannot be split into engines of tensor_parallel_size={tp}")
    return [gpus[i : i + tp] for i in range(0, len(gpus), tp)]


def _worker_main(config: BatchConfig, model_config: LlamaActionConfig, items: list[Item], worker: int,
                 devices: str, queue: Queue) -> None:
    """Entry point of a spawned worker: one engine on ``devices``, its share of the items."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    set_threads(config)
    try:
        # CUDA_VISIBLE_DEVICES shows this worker only its GPUs (a CPU-only machine runs it on config.device).
        device = "cuda" if torch.cuda.is_available() else config.device
        pipeline = build_pipeline(config, device=device, model_config=model_config)
        try:
            run_items(items, config, pipeline,
                      lambda record: queue.put(("record", worker, {**record, "gpus": devices})))
        finally:
            pipeline.close()
    except BaseException as err:  # noqa: BLE001  (reported to the parent, which records the unfinished samples)
        queue.put(("fatal", worker, one_line(err)))
        raise
    queue.put(("done", worker, None))


def run_workers(items: list[Item], config: BatchConfig, model_config: LlamaActionConfig, groups: list[list[str]],
                emit: Callable[[dict], None]) -> None:
    """One spawned worker per GPU group; records come back through a queue and are emitted here.

    A worker that dies has its unreported samples emitted as failed (stage ``generate``).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    shares = [items[w :: len(groups)] for w in range(len(groups))]
    procs = {}
    for w, group in enumerate(groups):
        if not shares[w]:
            continue
        devices = ",".join(group)
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = devices  # inherited by the spawned interpreter from its start
        try:
            proc = ctx.Process(target=_worker_main, args=(config, model_config, shares[w], w, devices, results),
                               name=f"terra-batch-gpu{devices}", daemon=False)
            proc.start()
        finally:
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous
        procs[w] = proc
    reported: dict[int, set[int]] = {w: set() for w in procs}
    fatal: dict[int, str] = {}
    running = set(procs)

    def handle(message: tuple) -> None:
        kind, w, payload = message
        if kind == "record":
            reported[w].add(payload["index"])
            emit(payload)
        elif kind == "fatal":
            fatal[w] = payload
        elif kind == "done":
            running.discard(w)

    try:
        while running:
            try:
                handle(results.get(timeout=1.0))
            except queue_module.Empty:
                pass
            for w in list(running):
                if not procs[w].is_alive():
                    while True:  # whatever it sent before exiting
                        try:
                            handle(results.get(timeout=0.5))
                        except queue_module.Empty:
                            break
                    if w in running:
                        running.discard(w)
                        reason = fatal.get(w) or f"worker exited with code {procs[w].exitcode}"
                        for item in shares[w]:
                            if item.sample.index not in reported[w]:
                                emit(sample_record(item.sample, "failed", stage="generate", seed=item.seed,
                                                   error=f"worker on GPU(s) {','.join(groups[w])} failed: {reason}"))
    except BaseException:
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc in procs.values():
            proc.join(timeout=30)
