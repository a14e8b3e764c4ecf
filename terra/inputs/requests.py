"""From a trajectory to a rollout's actions and requests, the same way for every entry point.

Frame ``t`` of a trajectory is context frame ``t``; ``actions[t]`` conditions frame ``t + 1``
(docs/ARCHITECTURE.md, "Actions"), so a rollout of ``num_frames`` after ``num_context`` frames needs
``num_context + num_frames - 1`` actions. Each function here reads and checks its input once and returns
checked actions; requests carry them on as they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from terra.generation.rollout import RolloutRequest
from terra.inputs.actions import actions_for_manoeuvre, actions_from_value, load_actions
from terra.inputs.context import resolve_path


def actions_needed(num_context: int, num_frames: int) -> int:
    """Actions a rollout uses: one per frame after the first, up to the last generated one."""
    return num_context + num_frames - 1


def manoeuvre_actions(name: str, num_context: int, num_frames: int, **params: float) -> np.ndarray:
    """Actions of a named manoeuvre for a rollout (``params`` as
    :func:`terra.inputs.trajectory.manoeuvre_trajectory`)."""
    return actions_for_manoeuvre(name, actions_needed(num_context, num_frames) + 1, **params)


def trajectory_actions(
    trajectory: Any, num_context: int, num_frames: int, source: str = "trajectory",
    base: Path | None = None, skip: int = 0,
) -> np.ndarray:
    """Actions for a rollout from any accepted trajectory: a file (.json/.csv/.npy, relative to ``base``), a
    mapping with one of :data:`TRAJECTORY_KEYS`, or an array (see :func:`terra.inputs.actions.actions_from_value`).

    ``skip`` drops the trajectory's first frames: they belong to context frames that are not used (ACT-Bench
    samples give actions from their first context frame on).
    """
    need = actions_needed(num_context, num_frames)
    if isinstance(trajectory, (str, os.PathLike)):
        path = resolve_path(trajectory, base) if base is not None else str(trajectory)
        return load_actions(path, num_frames=need)
    return actions_from_value(trajectory, source, need + skip, skip=skip, min_frames=need)


def rollout_requests(codes: np.ndarray, actions: np.ndarray, num_frames: int, seeds: Sequence[int],
                     overlap: int, routes: np.ndarray | None = None) -> list[RolloutRequest]:
    """One request per seed over the same encoded context, checked actions and routes (one per frame, for a model
    with route slots; None: no route)."""
    return [RolloutRequest(codes, actions, num_frames, seed=seed, overlap=overlap, routes=routes) for seed in seeds]
