"""From a trajectory to a rollout's actions, routes and requests, the same way for every entry point.

Frame ``t`` of a trajectory is context frame ``t``; ``actions[t]`` conditions frame ``t + 1``
(docs/ARCHITECTURE.md, "Actions"), so a rollout of ``num_frames`` after ``num_context`` frames needs
``num_context + num_frames - 1`` actions. A JSON trajectory (a file or a mapping) may carry ``routes`` beside its
trajectory form: one route per frame from the same frame 0, ``[T, K, 2]`` (``y, x``) or ``[T, K, 3]`` (``y, x, s``)
in each frame's ego frame (terra/generation/routes.py), for a model with ``K`` route slots; CSV and NPY trajectories
carry none. Each function here reads and checks its input once and returns checked values; requests carry them on
as they are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from terra.generation.rollout import RolloutRequest
from terra.generation.routes import validate_routes
from terra.inputs.actions import actions_for_manoeuvre, actions_from_value, load_trajectory
from terra.inputs.context import resolve_path

UNUSED_ROUTES = "the world model has no route slots (num_route_tokens 0), so it runs without them"


@dataclass(frozen=True)
class RolloutInputs:
    """What a trajectory gives a rollout, checked: ``actions`` ``[>= num_context + num_frames - 1, 6, 3]`` and
    ``routes`` ``[>= num_context + num_frames, K, 3]`` (None: none given, or a model without route slots);
    ``unused_routes``: routes were given but the model has no route slots (the caller says so in one line)."""

    actions: np.ndarray
    routes: np.ndarray | None = None
    unused_routes: bool = False


def actions_needed(num_context: int, num_frames: int) -> int:
    """Actions a rollout uses: one per frame after the first, up to the last generated one."""
    return num_context + num_frames - 1


def routes_needed(num_context: int, num_frames: int) -> int:
    """Routes a rollout takes: one per frame, context frames first (terra/generation/rollout.py, RolloutRequest)."""
    return num_context + num_frames


def manoeuvre_actions(name: str, num_context: int, num_frames: int, **params: float) -> np.ndarray:
    """Actions of a named manoeuvre for a rollout (``params`` as
    :func:`terra.inputs.trajectory.manoeuvre_trajectory`)."""
    return actions_for_manoeuvre(name, actions_needed(num_context, num_frames) + 1, **params)


def trajectory_inputs(
    trajectory: Any, num_context: int, num_frames: int, route_points: int = 0, source: str = "trajectory",
    base: Path | None = None, skip: int = 0,
) -> RolloutInputs:
    """Actions and routes for a rollout from any accepted trajectory: a file (.json/.csv/.npy, relative to ``base``),
    read once, a mapping with one of :data:`TRAJECTORY_KEYS` (and optionally ``routes``), or an array (see
    :func:`terra.inputs.actions.actions_from_value`). ``route_points`` is the model's route slots per frame (its
    ``num_route_tokens``), which a JSON trajectory's routes are checked against (see :func:`with_routes`).

    ``skip`` drops the trajectory's first frames, actions and routes alike: they belong to context frames that are
    not used (ACT-Bench samples give them from their first context frame on).
    """
    need = actions_needed(num_context, num_frames)
    if isinstance(trajectory, (str, os.PathLike)):
        path = resolve_path(trajectory, base) if base is not None else str(trajectory)
        value, actions = load_trajectory(path, num_frames=need + skip)
        actions, source = actions[skip:], str(path)
    else:
        value = trajectory
        actions = actions_from_value(trajectory, source, need + skip, skip=skip, min_frames=need)
    routes = value.get("routes") if isinstance(value, dict) else None
    return with_routes(actions, routes, num_context, num_frames, route_points, source, skip)


def trajectory_actions(
    trajectory: Any, num_context: int, num_frames: int, source: str = "trajectory",
    base: Path | None = None, skip: int = 0,
) -> np.ndarray:
    """The actions of :func:`trajectory_inputs`, for a caller whose rollouts take no route from the trajectory."""
    return trajectory_inputs(trajectory, num_context, num_frames, 0, source, base, skip).actions


def with_routes(actions: np.ndarray, routes: Any, num_context: int, num_frames: int, route_points: int, source: str,
                skip: int = 0) -> RolloutInputs:
    """Checked ``actions`` with the ``routes`` given beside them (None: none): checked once here against a model of
    ``route_points`` route slots (shape, finite, within reach, a route for every frame after the first ``skip``,
    which are dropped; terra/generation/routes.py, ``validate_routes``), or, for a model without route slots, not
    used (:attr:`RolloutInputs.unused_routes`)."""
    if routes is None:
        return RolloutInputs(actions)
    if not route_points:
        return RolloutInputs(actions, unused_routes=True)
    checked = validate_routes(routes, route_points, f"{source}: routes", routes_needed(num_context, num_frames) + skip)
    return RolloutInputs(actions, checked[skip:])


def rollout_requests(codes: np.ndarray, actions: np.ndarray, num_frames: int, seeds: Sequence[int],
                     overlap: int, routes: np.ndarray | None = None) -> list[RolloutRequest]:
    """One request per seed over the same encoded context, checked actions and routes (one per frame, for a model
    with route slots; None: no route)."""
    return [RolloutRequest(codes, actions, num_frames, seed=seed, overlap=overlap, routes=routes) for seed in seeds]
