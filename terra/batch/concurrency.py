"""How many rollouts one engine keeps in flight (``max_concurrent``).

``max_concurrent=auto`` is what the engine holds for the run's window: every rollout in flight grows to at most one
window (``num_context`` + its frames, capped at the model's window; docs/ARCHITECTURE.md, "Windows"), and the
backend says how many such rollouts fit (``WorldModelBackend.capacity``: on vLLM its KV cache's blocks over one
window's blocks, terra/generation/vllm_backend.py), up to the most the engine is built for (:func:`max_rollouts`:
``most_rollouts`` in terra/generation/resolve.py, ``GPU_ROLLOUTS`` on a GPU). The Transformers backend has no fixed
bound; ``auto`` is ``DEFAULT_ROLLOUTS`` there, or one rollout where it decodes speculatively (it takes speculative
rollouts' passes one after another): the table that decides the run's ``decoding=auto`` decides that too
(terra/generation/decoding.py), and the run's decoding is chosen for the count it gives (:func:`planned_rollouts`).
"""

from __future__ import annotations

from terra.batch.config import BatchSpec
from terra.config.backend import resolve_backend
from terra.config.spec import RunSpec
from terra.core.device import resolve_device
from terra.generation.backends import backend_kind
from terra.generation.resolve import DEFAULT_ROLLOUTS, most_rollouts
from terra.pipeline import WorldModelPipeline


def max_rollouts(config: BatchSpec, spec: RunSpec) -> int:
    """The most rollouts an engine of this run keeps in flight, which it is built to hold: ``max_concurrent``, or
    for ``auto`` the most an engine of ``spec``'s backend and device is built for (its device and backend resolved,
    its decoding ``auto`` or the run's choice)."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    return most_rollouts(spec.backend, spec.device, spec.sampling.decoding)


def planned_rollouts(config: BatchSpec, samples: int) -> tuple[int, int]:
    """Before the run is resolved (terra/run.py, ``resolve_run``, takes both): the rollouts its ``decoding=auto`` is
    chosen for, and the room its engine makes. The room is :func:`max_rollouts` on the device and backend the run
    will resolve to; the rollouts are that, capped by the ``samples`` to run."""
    device = resolve_device(config.run.device)
    most = max_rollouts(config, config.run.replace(device=device, backend=resolve_backend(config.run.backend, device)))
    return max(1, min(most, samples)), most


def resolve_max_concurrent(config: BatchSpec, pipeline: WorldModelPipeline, longest: int) -> int:
    """Rollouts in flight on ``pipeline``'s engine: ``config.max_concurrent``, or for ``auto`` the most an engine
    of its backend, device and decoding is built for, capped by what it holds for windows of the run's longest
    rollout (``longest`` generated frames; the backend's :meth:`~terra.generation.rollout.WorldModelBackend.capacity`,
    else ``DEFAULT_ROLLOUTS``)."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    backend = pipeline.backend
    window_frames = min(backend.layout.max_frames, config.run.num_context + longest)
    most = most_rollouts(backend_kind(backend), str(pipeline.device), backend.decoding)
    return min(most, backend.capacity(window_frames) or DEFAULT_ROLLOUTS)
