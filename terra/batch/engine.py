"""Running planned samples on one engine: prepare (load, encode, actions) → generate → decode and write.

Samples go to the backend in chunks of ``max_concurrent`` rollouts per ``generate`` call; the next chunk is
read and encoded on a helper thread while the current one generates, and each rollout is decoded and written
by one of ``writer_threads`` threads as soon as its last frame is generated.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from decoder import draw_trajectory, mark_frames, write_sidecar, write_video
from terra.batch.config import BatchConfig
from terra.batch.manifest import one_line, sample_record
from terra.batch.plan import Item
from terra.errors import TerraInputError
from terra.generation.rollout import RolloutRequest
from terra.generation.sampling import SamplingConfig
from terra.inputs import TRAJECTORY_KEYS, load_context, manoeuvre_actions, rollout_requests, trajectory_actions
from terra.models import LlamaActionConfig
from terra.pipeline import WorldModelPipeline
from terra.refiner import check_decoding
from tokenizer import ImageTokenizer
from tokenizer.atomic import atomic_path

SIDECAR_VERSION = 1  # of the sidecar's "batch" block


def build_pipeline(config: BatchConfig, device: str | None = None, model_config: LlamaActionConfig | None = None,
                   tokenizer: ImageTokenizer | None = None) -> WorldModelPipeline:
    """Load the tokenizer and world model of ``config`` on ``device`` (default ``config.device``).

    ``model_config``, ``tokenizer``: the world model's config and the tokenizer as the run already read them
    (else they are loaded here).
    """
    return WorldModelPipeline.from_pretrained(
        config.world_model, tokenizer or config.tokenizer, backend=config.backend, device=device or config.device,
        dtype=config.dtype, config=model_config, zero_embed_code_0=config.zero_embed_code_0,
        **dict(config.backend_options),
    )


def set_threads(config: BatchConfig) -> None:
    """Apply ``config.num_threads`` to torch's CPU thread pool (None: leave torch's default)."""
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)


@dataclass
class _Prepared:
    """A sample ready to generate: its request and what its sidecar and overlays need."""

    item: Item
    request: RolloutRequest
    actions: np.ndarray
    context: list[str]  # the context sources read
    num_context: int
    started: float  # perf_counter when its chunk began preparing


def _prepare(item: Item, pipeline: WorldModelPipeline, config: BatchConfig, started: float) -> _Prepared:
    """Load and encode a sample's context, build its actions and request (raises on bad input)."""
    sample, record = item.sample, item.sample.record
    jsonl_dir = Path(sample.file).resolve().parent
    image_base = Path(config.image_root).expanduser() if config.image_root else jsonl_dir
    where = f"sample {sample.sample_id!r}"
    if sample.kind == "actbench":
        images, sources = load_context(record["context_frames"], pipeline.image_size, None, base=image_base,
                                       resize=config.resize)
        drop = max(0, len(images) - config.num_context)  # instruction_trajs[0] belongs to context_frames[0]
        images = images[drop:]
        actions = trajectory_actions({"instruction_trajs": record["instruction_trajs"]}, len(images), item.num_frames,
                                     f"{where}: instruction_trajs", skip=drop)
    else:
        images, sources = load_context(record["context"], pipeline.image_size, config.num_context, base=image_base,
                                       resize=config.resize)
        given = [k for k in TRAJECTORY_KEYS if k in record]
        if not given:
            if config.default_manoeuvre is None:
                raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)} "
                                      "or set default_manoeuvre")
            actions = manoeuvre_actions(config.default_manoeuvre, len(images), item.num_frames)
        else:
            key = given[0]
            # a "trajectory" string is a file next to the JSONL; everything else is inline
            trajectory = record[key] if key == "trajectory" and isinstance(record[key], str) else {key: record[key]}
            actions = trajectory_actions(trajectory, len(images), item.num_frames, f"{where}: {key}", base=jsonl_dir)
    codes = pipeline.encode(images)
    [request] = rollout_requests(codes, actions, item.num_frames, [item.seed], config.overlap,
                                 pipeline.backend.layout)
    return _Prepared(item, request, actions, sources, len(images), started)


class _Writer:
    """Decodes finished rollouts and writes their videos, codes and sidecar (sidecar last) on its threads."""

    def __init__(self, pipeline: WorldModelPipeline, config: BatchConfig, emit: Callable[[dict], None]) -> None:
        self.pipeline, self.config, self.emit = pipeline, config, emit
        self.pool = ThreadPoolExecutor(max_workers=config.writer_threads, thread_name_prefix="terra-batch-writer")
        self.refiner = None  # decoding=refiner: Terra's video refiner beside the engine (terra/refiner.py)
        if config.decoding == "refiner":
            self.refiner = check_decoding(config.decoding, config.refiner, pipeline.device).load()
        self.refiner_lock = threading.Lock()  # one refinement at a time on the GPU

    def submit(self, prepared: _Prepared, generated: np.ndarray, generate_s: float) -> None:
        self.pool.submit(self._write, prepared, generated, generate_s)

    def _write(self, prepared: _Prepared, generated: np.ndarray, generate_s: float) -> None:
        item = prepared.item
        try:
            files = self.write(prepared, generated, generate_s)
        except Exception as err:  # noqa: BLE001  (recorded; the other samples go on)
            self.emit(sample_record(item.sample, "failed", error=one_line(err), stage="write", seed=item.seed,
                                    seconds=time.perf_counter() - prepared.started))
            return
        self.emit(sample_record(item.sample, "ok", seconds=time.perf_counter() - prepared.started, seed=item.seed,
                                files=files, generate_s=round(generate_s, 3)))

    def write(self, prepared: _Prepared, generated: np.ndarray, generate_s: float) -> list[str]:
        """Decode context + generated codes and write the sample's files; return them relative to output_dir."""
        config, item, pipeline = self.config, prepared.item, self.pipeline
        t0 = time.perf_counter()
        grid = pipeline.tokenizer.grid_shape
        context = np.asarray(prepared.request.context).reshape(-1, *grid)
        codes = np.concatenate([context, np.asarray(generated).reshape(-1, *grid)])
        if self.refiner is None:
            frames = pipeline.decode(codes)
        else:
            with self.refiner_lock:
                frames = self.refiner.refine(codes, pipeline.tokenizer, seed=item.seed).frames
        decode_s = time.perf_counter() - t0
        shown = frames
        if config.overlay_trajectory:
            shown = draw_trajectory(shown, prepared.actions[: len(shown)])
        if config.mark_context:
            shown = mark_frames(shown, prepared.num_context)
        out = Path(config.output_dir)
        files = []
        for path in item.videos.values():
            write_video(path, shown, fps=config.fps)
            files.append(os.path.relpath(path, out))
        if item.codes is not None:
            with atomic_path(item.codes) as tmp:
                np.save(tmp, codes.astype(np.int32))
            files.append(os.path.relpath(item.codes, out))
        sample = item.sample
        write_sidecar(
            item.sidecar, config=config.record if config.record is not None else dataclasses.asdict(config),
            seed=item.seed, actions=prepared.actions[: len(codes) - 1],
            timings={"generate_s": generate_s, "decode_s": decode_s,
                     "write_s": time.perf_counter() - t0 - decode_s,
                     "total_s": time.perf_counter() - prepared.started},
            sample_id=sample.sample_id, label=sample.record.get("label"),
            source={"file": sample.file, "line": sample.line, "format": sample.kind},
            context=prepared.context, num_context=prepared.num_context, num_generated=int(len(generated)),
            files=files, batch={"version": SIDECAR_VERSION, "fingerprint": item.fingerprint, "complete": True,
                                "frames": int(len(codes))},
        )
        return files + [os.path.relpath(item.sidecar, out)]

    def close(self) -> None:
        """Wait for every submitted write."""
        self.pool.shutdown(wait=True)


def _prepare_chunk(chunk: Sequence[Item], pipeline: WorldModelPipeline, config: BatchConfig,
                   emit: Callable[[dict], None]) -> list[_Prepared]:
    """Load and encode a chunk's samples; a failing one is emitted as failed and left out."""
    started = time.perf_counter()
    ready: list[_Prepared] = []
    for item in chunk:
        try:
            ready.append(_prepare(item, pipeline, config, started))
        except Exception as err:  # noqa: BLE001  (one bad sample must not stop the others)
            emit(sample_record(item.sample, "failed", error=one_line(err), stage="input", seed=item.seed,
                               seconds=time.perf_counter() - started))
    return ready


def run_items(items: Sequence[Item], config: BatchConfig, pipeline: WorldModelPipeline,
              emit: Callable[[dict], None]) -> None:
    """Run ``items`` on ``pipeline`` in chunks of ``max_concurrent``; ``emit`` receives one record per item.

    Per chunk: load + encode every sample (a failing one is emitted as failed; a helper thread prepares the
    next chunk while this one generates), then one ``generate`` call with all requests; each rollout is
    handed to the writer threads the moment its last frame arrives.
    """
    sampling = SamplingConfig(**config.sampling)
    chunks = [items[i : i + config.max_concurrent] for i in range(0, len(items), config.max_concurrent)]
    writer = _Writer(pipeline, config, emit)
    preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terra-batch-prepare")
    try:
        upcoming = preparer.submit(_prepare_chunk, chunks[0], pipeline, config, emit) if chunks else None
        for k in range(len(chunks)):
            ready = upcoming.result()
            if k + 1 < len(chunks):
                upcoming = preparer.submit(_prepare_chunk, chunks[k + 1], pipeline, config, emit)
            if not ready:
                continue
            image_tokens = pipeline.backend.layout.image_tokens
            buffers = [np.zeros((p.request.num_frames, image_tokens), np.int64) for p in ready]
            handed = [False] * len(ready)
            t_gen = time.perf_counter()

            def frame_done(index: int, frame: int, codes: np.ndarray) -> None:
                try:
                    buffers[index][frame] = np.asarray(codes).reshape(-1)
                    if frame == ready[index].request.num_frames - 1 and not handed[index]:
                        handed[index] = True
                        writer.submit(ready[index], buffers[index], time.perf_counter() - t_gen)
                except Exception:  # noqa: BLE001  (never break the engine loop; the rollout is written below)
                    handed[index] = False

            try:
                generated = pipeline.backend.generate([p.request for p in ready], sampling, progress=False,
                                                      on_frame=frame_done)
            except Exception as err:  # noqa: BLE001  (the engine failed this chunk; record and go on)
                for prepared, done in zip(ready, handed):
                    if not done:
                        emit(sample_record(prepared.item.sample, "failed", error=one_line(err), stage="generate",
                                           seed=prepared.item.seed, seconds=time.perf_counter() - prepared.started))
                continue
            for i, prepared in enumerate(ready):  # rollouts whose last frame was not reported through on_frame
                if not handed[i]:
                    handed[i] = True
                    writer.submit(prepared, generated[i], time.perf_counter() - t_gen)
    finally:
        preparer.shutdown(wait=True, cancel_futures=True)
        writer.close()
