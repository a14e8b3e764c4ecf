"""What a user gives, turned into what the model takes: actions, trajectories, routes, context frames, requests."""

from __future__ import annotations

from terra.core.lazy import lazy_face

_HOMES = {
    "TRAJECTORY_KEYS": "terra.inputs.actions",
    "UNUSED_ROUTES": "terra.inputs.requests",
    "load_context": "terra.inputs.context",
    "manoeuvre_actions": "terra.inputs.requests",
    "resolve_path": "terra.inputs.context",
    "rollout_requests": "terra.inputs.requests",
    "trajectory_actions": "terra.inputs.requests",
    "trajectory_inputs": "terra.inputs.requests",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)
