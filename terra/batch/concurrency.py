"""How many rollouts one engine keeps in flight (``max_concurrent``), and the engine options that follow from it.

``max_concurrent=auto`` is what the engine holds for the run's window: every rollout in flight grows to at most one
window (``num_context`` + its frames, capped at the model's window; docs/ARCHITECTURE.md, "Windows"), and the
backend says how many such rollouts fit (``WorldModelBackend.capacity``: on vLLM its KV cache's blocks over one
window's blocks, terra/generation/vllm_backend.py). The engine is built with room for that many sequences
(``max_num_seqs``, up to :data:`AUTO_CEILING_GPU` on a GPU). The Transformers backend has no fixed bound;
``auto`` is :data:`AUTO_FALLBACK` there.
"""

from __future__ import annotations

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


def resolve_max_concurrent(config: BatchConfig, pipeline: WorldModelPipeline, longest: int) -> int:
    """Rollouts in flight on ``pipeline``'s engine: ``config.max_concurrent``, or for ``auto`` what the engine
    holds for windows of the run's longest rollout (``longest`` generated frames; the backend's
    :meth:`~terra.generation.rollout.WorldModelBackend.capacity`), else :data:`AUTO_FALLBACK`."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    window_frames = min(pipeline.backend.layout.max_frames, config.num_context + longest)
    return pipeline.backend.capacity(window_frames) or AUTO_FALLBACK
