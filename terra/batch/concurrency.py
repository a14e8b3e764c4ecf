"""How many rollouts one engine keeps in flight (``max_concurrent``).

``max_concurrent=auto`` is what the engine holds for the run's window: every rollout in flight grows to at most one
window (``num_context`` + its frames, capped at the model's window; docs/ARCHITECTURE.md, "Windows"), and the
backend says how many such rollouts fit (``WorldModelBackend.capacity``: on vLLM its KV cache's blocks over one
window's blocks, terra/generation/vllm_backend.py). The engine is built with room for the most the run may keep in
flight (:func:`max_rollouts`: on a GPU, up to ``GPU_ROLLOUTS`` for ``auto``; terra/generation/backends.py). The
Transformers backend has no fixed bound; ``auto`` is ``DEFAULT_ROLLOUTS`` there.
"""

from __future__ import annotations

from terra.batch.config import BatchConfig
from terra.generation.backends import DEFAULT_ROLLOUTS, GPU_ROLLOUTS, most_rollouts
from terra.pipeline import WorldModelPipeline


def max_rollouts(config: BatchConfig, device: str) -> int:
    """The most rollouts an engine of this run on the resolved ``device`` keeps in flight, which it is built to hold:
    ``max_concurrent``, or for ``auto`` the most an engine there is built for."""
    return most_rollouts(device) if config.max_concurrent == "auto" else int(config.max_concurrent)


def planned_streams(config: BatchConfig, samples: int) -> int:
    """The most rollouts an engine of this run keeps in flight, before its device is known: ``max_concurrent``
    (``auto``: the ceiling on a GPU, the only place a vLLM engine decodes speculatively) capped by the ``samples`` to
    run. A vLLM engine's decoding is chosen for it (terra/generation/backends.py, ``resolve_spec``)."""
    ceiling = GPU_ROLLOUTS if config.max_concurrent == "auto" else int(config.max_concurrent)
    return max(1, min(ceiling, samples))


def resolve_max_concurrent(config: BatchConfig, pipeline: WorldModelPipeline, longest: int) -> int:
    """Rollouts in flight on ``pipeline``'s engine: ``config.max_concurrent``, or for ``auto`` what the engine
    holds for windows of the run's longest rollout (``longest`` generated frames; the backend's
    :meth:`~terra.generation.rollout.WorldModelBackend.capacity`), else ``DEFAULT_ROLLOUTS``."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    window_frames = min(pipeline.backend.layout.max_frames, config.num_context + longest)
    return pipeline.backend.capacity(window_frames) or DEFAULT_ROLLOUTS
