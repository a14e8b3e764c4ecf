"""How many rollouts one engine keeps in flight (``max_concurrent``, ``auto`` sized to the backend's capacity)."""

from __future__ import annotations

from terra.batch.config import BatchSpec
from terra.config.backend import resolve_backend
from terra.config.spec import RunSpec
from terra.core.device import resolve_device
from terra.generation.backends import backend_kind
from terra.generation.resolve import DEFAULT_ROLLOUTS, most_rollouts
from terra.pipeline import WorldModelPipeline


def max_rollouts(config: BatchSpec, spec: RunSpec) -> int:
    """The most rollouts an engine of this run holds: ``max_concurrent``, or the backend's bound for ``auto``."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    return most_rollouts(spec.backend, spec.device, spec.sampling.decoding)


def planned_rollouts(config: BatchSpec, samples: int) -> tuple[int, int]:
    """``(rollouts decoding=auto is chosen for, engine room)`` before the run is resolved."""
    device = resolve_device(config.run.device)
    most = max_rollouts(config, config.run.replace(device=device, backend=resolve_backend(config.run.backend, device)))
    return max(1, min(most, samples)), most


def resolve_max_concurrent(config: BatchSpec, pipeline: WorldModelPipeline, longest: int) -> int:
    """Rollouts in flight on ``pipeline``'s engine, ``auto`` capped for ``longest`` generated frames."""
    if config.max_concurrent != "auto":
        return int(config.max_concurrent)
    backend = pipeline.backend
    window_frames = min(backend.layout.max_frames, config.run.num_context + longest)
    most = most_rollouts(backend_kind(backend), str(pipeline.device), backend.decoding)
    return min(most, backend.capacity(window_frames) or DEFAULT_ROLLOUTS)
