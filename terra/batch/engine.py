"""What one engine does per sample: prepare (load, encode, actions), then decode and write once generated.

:func:`prepare_sample` turns a sample into a rollout request; :class:`SampleWriter` decodes each finished rollout
and writes its files on ``writer_threads`` threads. The pipeline is built as every app's is (terra/pipeline.py,
``resolve_run`` and ``WorldModelPipeline.from_run``); the loop that keeps the engine full between the two is
terra/batch/stream.py.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from terra.batch.config import BatchSpec
from terra.batch.manifest import sample_error, sample_record
from terra.batch.plan import Item
from terra.batch.samples import context_paths, sample_actions
from terra.config.sampling import SamplingConfig
from terra.core.atomic import atomic_path
from terra.decoder import write_sidecar
from terra.generation.rollout import DecodeStats, RolloutRequest
from terra.inputs.context import load_context
from terra.inputs.requests import rollout_requests
from terra.outputs import shown_frames, write_formats
from terra.pipeline import WorldModelPipeline

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

SIDECAR_VERSION = 1  # of the sidecar's "batch" block


@dataclass
class PreparedSample:
    """A sample ready to generate: its request and what its sidecar and overlays need."""

    item: Item
    request: RolloutRequest
    actions: np.ndarray
    context: list[str]  # the context sources read
    num_context: int
    started: float  # perf_counter when it began preparing


def prepare_sample(item: Item, pipeline: WorldModelPipeline, config: BatchSpec, started: float) -> PreparedSample:
    """Load and encode a sample's context, build its actions and request (raises on bad input; the checks of
    terra/batch/samples.py ran when the run was planned)."""
    sample = item.sample
    every = sample.kind == "actbench"  # ACT-Bench samples read every context frame, then use the last ones
    images, sources = load_context(context_paths(sample, config), pipeline.image_size,
                                   None if every else config.run.num_context, resize=config.run.resize)
    actions = item.actions  # built when the run was planned, unless the context is a video (counted only now)
    if actions is None:
        actions = sample_actions(sample, config, len(images), item.num_frames)
    images = images[max(0, len(images) - config.run.num_context) :]
    codes = pipeline.encode(images)
    [request] = rollout_requests(codes, actions, item.num_frames, [item.seed], config.run.overlap)
    return PreparedSample(item, request, actions, sources, len(images), started)


class SampleWriter:
    """Decodes finished rollouts and writes their videos, codes and sidecar (sidecar last) on its threads."""

    def __init__(self, pipeline: WorldModelPipeline, config: BatchSpec, emit: Callable[[dict], None],
                 sampling: SamplingConfig, refiner: "VideoRefiner | None" = None) -> None:
        self.pipeline, self.config, self.emit = pipeline, config, emit
        self.sampling = sampling  # as the engine runs it (decoding=auto resolved)
        self.refiner = refiner  # decoding=refiner: Terra's video refiner beside the engine (terra/refiner.py)
        self.pool = ThreadPoolExecutor(max_workers=config.writer_threads, thread_name_prefix="terra-batch-writer")

    def submit(self, prepared: PreparedSample, generated: np.ndarray, generate_s: float, stats: DecodeStats) -> None:
        self.pool.submit(self._write, prepared, generated, generate_s, stats, time.time())

    def _write(self, prepared: PreparedSample, generated: np.ndarray, generate_s: float, stats: DecodeStats,
               generated_at: float) -> None:
        item = prepared.item
        try:
            files = self.write(prepared, generated, generate_s, stats)
        except Exception as err:  # noqa: BLE001  (recorded; the other samples go on)
            self.emit(sample_record(item.sample, "failed", error=sample_error(err), stage="write", seed=item.seed,
                                    seconds=time.perf_counter() - prepared.started))
            return
        self.emit(sample_record(item.sample, "ok", seconds=time.perf_counter() - prepared.started, seed=item.seed,
                                files=files, generate_s=round(generate_s, 3), generated_at=round(generated_at, 3),
                                decoding=stats.as_dict(self.sampling)))

    def write(self, prepared: PreparedSample, generated: np.ndarray, generate_s: float,
              stats: DecodeStats) -> list[str]:
        """Decode context + generated codes and write the sample's files; return them relative to output_dir."""
        config, item, pipeline = self.config, prepared.item, self.pipeline
        t0 = time.perf_counter()
        grid = pipeline.tokenizer.grid_shape
        context = np.asarray(prepared.request.context).reshape(-1, *grid)
        codes = np.concatenate([context, np.asarray(generated).reshape(-1, *grid)])
        frames, _ = pipeline.frames(codes, item.seed, self.refiner)
        decode_s = time.perf_counter() - t0
        shown = shown_frames(frames, prepared.actions, prepared.num_context, config.mark_context,
                             config.overlay_trajectory)
        out = Path(config.output_dir)
        write_formats(item.videos, shown, config.fps, [])
        files = [os.path.relpath(path, out) for path in item.videos.values()]
        if item.codes is not None:
            with atomic_path(item.codes) as tmp:
                np.save(tmp, codes.astype(np.int32))
            files.append(os.path.relpath(item.codes, out))
        sample = item.sample
        write_sidecar(
            item.sidecar, config=config.record,
            seed=item.seed, actions=prepared.actions[: len(codes) - 1],
            timings={"generate_s": generate_s, "decode_s": decode_s,
                     "write_s": time.perf_counter() - t0 - decode_s,
                     "total_s": time.perf_counter() - prepared.started},
            sample_id=sample.sample_id, label=sample.record.get("label"),
            source={"file": sample.file, "line": sample.line, "format": sample.kind},
            context=prepared.context, num_context=prepared.num_context, num_generated=int(len(generated)),
            files=files, decoding=stats.as_dict(self.sampling),
            batch={"version": SIDECAR_VERSION, "fingerprint": item.fingerprint, "complete": True,
                   "frames": int(len(codes))},
        )
        return files + [os.path.relpath(item.sidecar, out)]

    def close(self) -> None:
        """Wait for every submitted write."""
        self.pool.shutdown(wait=True)
