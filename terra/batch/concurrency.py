"""How many rollouts one engine keeps in flight (``max_concurrent``), and the engine options that follow from it.

``max_concurrent=auto`` on vLLM is what the engine's KV cache holds for the run's window: every rollout in flight
is one engine sequence whose prompt grows to at most one window (``num_context`` + its frames, capped at the
model's window; docs/ARCHITECTURE.md, "Windows"), so the cache's blocks divided by one such window's blocks is
how many rollouts fit without preemption. The engine is built with room for that many sequences
(``max_num_seqs``, up to :data:`AUTO_CEILING_GPU` on a GPU). The Transformers backend has no fixed cache;
``auto`` is :data:`AUTO_FALLBACK` there.
"""

from __future__ import annotations

import math
from typing import Any

from terra.batch.config import BatchConfig
from terra.config.spec import RunSpec
from terra.pipeline import WorldModelPipeline

AUTO_CEILING_GPU = 512  # vLLM's largest CUDA-graph batch by default; more sequences per step gain little
AUTO_FALLBACK = 64  # Transformers, vLLM's CPU engine, or a vLLM release that does not report its cache size


def engine_options(config: BatchConfig, spec: RunSpec) -> dict[str, Any]:
    """``backend.options`` for an engine of this run as ``spec`` (resolved: device and backend) runs it: on vLLM
    ``max_num_seqs`` follows ``max_concurrent`` (an explicit number, or the ceiling of ``auto``)."""
    options = dict(spec.backend_options)
    if spec.backend == "vllm":
        ceiling = AUTO_CEILING_GPU if spec.device.startswith("cuda") else AUTO_FALLBACK
        options["max_num_seqs"] = ceiling if config.max_concurrent == "auto" else int(config.max_concurrent)
    return options


def planned_streams(config: BatchConfig, samples: int) -> int:
    """The most rollouts an engine of this run keeps in flight, before it starts: ``max_concurrent`` (``auto``: its
    ceiling on a GPU) capped by the ``samples`` to run. A vLLM engine's decoding is chosen for it
    (terra/generation/backends.py, ``resolve_spec``)."""
    ceiling = AUTO_CEILING_GPU if config.max_concurrent == "auto" else int(config.max_concurrent)
    return max(1, min(ceiling, samples))


def kv_cache_rollouts(pipeline: WorldModelPipeline, window_frames: int) -> int | None:
    """Rollouts of ``window_frames`` frames the vLLM engine's KV cache holds at once (None: not a vLLM engine,
    or it does not report its cache)."""
    engine = getattr(pipeline.backend, "engine", None)
    cache = getattr(getattr(engine, "vllm_config", None), "cache_config", None)
    blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    if not blocks or not block_size:
        return None
    layout = pipeline.backend.layout
    tokens = window_frames * layout.frame_span
    return max(1, int(blocks) // math.ceil(tokens / int(block_size)))


def resolve_max_concurrent(config: BatchConfig, pipeline: WorldModelPipeline, longest: int) -> int:
    """Rollouts in flight on ``pipeline``'s engine: ``config.max_concurrent``, or for ``auto`` what the KV cache
    holds for windows of the run's longest rollout (``longest`` generated frames), capped by ``max_num_seqs``."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    window_frames = min(pipeline.backend.layout.max_frames, config.num_context + longest)
    fits = kv_cache_rollouts(pipeline, window_frames)
    if fits is None:
        return AUTO_FALLBACK
    engine = pipeline.backend.engine
    seqs = getattr(getattr(engine.vllm_config, "scheduler_config", None), "max_num_seqs", None) or fits
    return max(1, min(fits, int(seqs)))
