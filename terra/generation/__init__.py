"""Generation: rollout requests and their windows, sampling, and the backends that run them."""

from __future__ import annotations

from terra.core.lazy import lazy_face

_HOMES = {
    "FrameCallback": "terra.generation.rollout",
    "RolloutRequest": "terra.generation.rollout",
    "RolloutState": "terra.generation.rollout",
    "WorldModelBackend": "terra.generation.rollout",
    "SamplingConfig": "terra.config.sampling",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)
