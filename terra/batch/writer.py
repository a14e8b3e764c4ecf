"""A finished rollout decoded and written on writer threads: videos, codes and sidecar (sidecar last)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from terra.batch.config import BatchSpec
from terra.batch.manifest import sample_error, sample_record
from terra.batch.prepared_sample import PreparedSample
from terra.config.sampling import SamplingConfig
from terra.core.atomic import atomic_path, written
from terra.decoder import write_sidecar
from terra.generation.pass_stats import PassStats
from terra.outputs import route_record, shown_frames, write_formats
from terra.pipeline import WorldModelPipeline

if TYPE_CHECKING:
    from terra.decoder.refiner.model import VideoRefiner

SIDECAR_VERSION = 1  # of the sidecar's "batch" block


class SampleWriter:
    """Decodes finished rollouts and writes their videos, codes and sidecar (sidecar last) on its threads."""

    def __init__(self, pipeline: WorldModelPipeline, config: BatchSpec, emit: Callable[[dict], None],
                 sampling: SamplingConfig, refiner: "VideoRefiner | None" = None) -> None:
        self.pipeline, self.config, self.emit = pipeline, config, emit
        self.sampling = sampling  # as the engine runs it (decoding=auto resolved)
        self.refiner = refiner  # decoder=refiner: Terra's video refiner
        self.pool = ThreadPoolExecutor(max_workers=config.writer_threads, thread_name_prefix="terra-batch-writer")

    def submit(self, prepared: PreparedSample, generated: np.ndarray, generate_s: float, stats: PassStats) -> None:
        self.pool.submit(self._write, prepared, generated, generate_s, stats, time.time())

    def _write(self, prepared: PreparedSample, generated: np.ndarray, generate_s: float, stats: PassStats,
               generated_at: float) -> None:
        item = prepared.item
        try:
            files = self.write(prepared, generated, generate_s, stats)
        except Exception as err:  # noqa: BLE001  (recorded; the other samples go on)
            self.emit(sample_record(item.sample, "failed", error=sample_error(err), stage="write", seed=item.seed,
                                    seconds=time.perf_counter() - prepared.started))
            return
        told = {} if prepared.route_source is None else {  # each frame's verdict, where the sample gave routes
            "route_told": routes_said(prepared, len(prepared.request.context) + len(generated))["route_told"]}
        self.emit(sample_record(item.sample, "ok", seconds=time.perf_counter() - prepared.started, seed=item.seed,
                                files=files, generate_s=round(generate_s, 3), generated_at=round(generated_at, 3),
                                decoding=stats.as_dict(self.sampling), **told))

    def write(self, prepared: PreparedSample, generated: np.ndarray, generate_s: float,
              stats: PassStats) -> list[str]:
        """Decode context + generated codes and write the sample's files; return them relative to output_dir."""
        config, item, pipeline = self.config, prepared.item, self.pipeline
        t0 = time.perf_counter()
        grid = pipeline.tokenizer.grid_shape
        context = np.asarray(prepared.request.context).reshape(-1, *grid)
        codes = np.concatenate([context, np.asarray(generated).reshape(-1, *grid)])
        frames, _ = pipeline.frames(codes, item.seed, self.refiner)
        decode_s = time.perf_counter() - t0
        routes = prepared.request.routes
        shown = shown_frames(frames, prepared.actions, prepared.num_context, config.mark_context,
                             config.overlay_trajectory, routes)
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
            **routes_said(prepared, len(codes)),  # told, whence
            files=files, decoding=stats.as_dict(self.sampling),
            engine_options=pipeline.engine_options,  # as the engine ran
            batch={"version": SIDECAR_VERSION, "fingerprint": item.fingerprint,
                   "inputs": item.made_from, "complete": True, "frames": int(len(codes)),
                   "file_digests": written(out, files)},
        )
        return files + [os.path.relpath(item.sidecar, out)]

    def close(self) -> None:
        """Wait for every submitted write."""
        self.pool.shutdown(wait=True)


def routes_said(prepared: PreparedSample, frames: int) -> dict:
    """What the sidecar says of ``prepared``'s routes over its ``frames`` frames (:func:`route_record`)."""
    return route_record(prepared.request.routes, prepared.route_source, frames, prepared.route_told)
