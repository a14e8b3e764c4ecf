"""From a trajectory to a rollout's actions, routes and requests, the same way for every entry point."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from terra.config.checks import shown
from terra.contract.actions import FRAME_RATE_HZ, validate_actions
from terra.contract.routes import NO_ROUTE_SLOTS, TOLD, validate_routes
from terra.core.errors import TerraInputError
from terra.generation.rollout import RolloutRequest
from terra.inputs.actions import (Manoeuvre, actions_for_manoeuvre, actions_of, motion_of, read_trajectory_file,
                                  trajectory_file_errors)
from terra.inputs.context import resolve_path
from terra.inputs.routes import ROAD, GivenRoutes, given_routes, road_routes
from terra.inputs.trajectory import EgoTrajectory

UNUSED_ROUTES = f"{NO_ROUTE_SLOTS}, so it runs without them"


@dataclass(frozen=True)
class RolloutInputs:
    """What a trajectory gives a rollout, checked: ``actions [>= num_context + num_frames - 1, 6, 3]`` and
    ``routes [>= num_context + num_frames, K, 3]`` (None: none given, or a model without route slots)."""

    actions: np.ndarray
    routes: np.ndarray | None = None
    route_source: str | None = None
    unused_routes: bool = False
    manoeuvre: Manoeuvre | None = None
    no_route: bool = False
    route_told: tuple[str, ...] | None = None


def manoeuvre_actions(name: str, num_context: int, num_frames: int, **params: float) -> np.ndarray:
    """Actions of a named manoeuvre for a rollout (``params`` as :func:`manoeuvre_trajectory`)."""
    return actions_for_manoeuvre(name, num_context + num_frames, **params)


def trajectory_inputs(trajectory: Any, num_context: int, num_frames: int, route_tokens: int = 0,
                      source: str = "trajectory", base: Path | None = None, skip: int = 0,
                      beside: GivenRoutes | None = None) -> RolloutInputs:
    """Actions and routes from a trajectory file (relative to ``base``), mapping or array, less its first ``skip``."""
    need = num_context + num_frames - 1  # one action per frame after the first
    file = isinstance(trajectory, (str, os.PathLike))
    if file:
        source = resolve_path(trajectory, base) if base is not None else str(trajectory)
    with trajectory_file_errors(source) if file else nullcontext():
        value = read_trajectory_file(Path(source)) if file else trajectory
        motion = motion_of(value, source, need + skip)
        actions = actions_of(motion, source, need + skip)
    actions = validate_actions(actions, source, need + skip)[skip:]
    given = given_routes(value, source, Path(source).parent if file else base) if isinstance(value, dict) else None
    if beside is not None:
        if given is not None:
            raise TerraInputError(f"{beside.where} gives routes twice, in the sample and in its trajectory file "
                                  f"{shown(Path(source).name)}; keep one")
        given = beside
    inputs = with_routes(actions, given, num_context, num_frames, route_tokens, skip, motion)
    return replace(inputs, manoeuvre=motion) if isinstance(motion, Manoeuvre) else inputs


def trajectory_actions(trajectory: Any, num_context: int, num_frames: int, source: str = "trajectory",
                       base: Path | None = None, skip: int = 0, no_route: str = "it takes no route") -> np.ndarray:
    """The actions of :func:`trajectory_inputs`; routes in the trajectory are one line ending in ``no_route``."""
    given = trajectory_inputs(trajectory, num_context, num_frames, 0, source, base, skip)
    if given.unused_routes:
        raise TerraInputError(f"{source}: the trajectory carries routes, but {no_route}; leave them out")
    return given.actions


def with_routes(actions: np.ndarray, given: GivenRoutes | None, num_context: int, num_frames: int, route_tokens: int,
                skip: int = 0, motion: Any = None) -> RolloutInputs:
    """Checked ``actions`` with their routes (None: none) checked against a model of ``route_tokens`` route slots."""
    if given is None:
        return RolloutInputs(actions)
    if given.value is None:
        return RolloutInputs(actions, no_route=True)
    if not route_tokens:
        return RolloutInputs(actions, unused_routes=True)
    frames = num_context + num_frames + skip  # one route per frame
    if given.key == ROAD:
        world = motion.motion if isinstance(motion, Manoeuvre) else motion
        if not isinstance(world, EgoTrajectory):
            raise TerraInputError(f"{given.source}: a road is followed along the trajectory's world poses, which a "
                                  "\"trajectory\" (x, y) or a \"manoeuvre\" has; actions and instruction_trajs are in "
                                  "each frame's own ego frame: give ego_routes instead")
        ticks = world.t[0] + np.arange(frames) / FRAME_RATE_HZ
        routes, told = road_routes(given.value, world, ticks, route_tokens, given.source)
    else:
        routes = validate_routes(given.value, route_tokens, given.source, ahead=True)
        if len(routes) < frames:
            raise TerraInputError(_too_few(given.source, len(routes), num_context, num_frames, skip))
        told = [TOLD] * len(routes)
    return RolloutInputs(actions, routes[skip:], route_source=given.source, route_told=tuple(told[skip:]))


def _too_few(source: str, given: int, num_context: int, num_frames: int, skip: int) -> str:
    """The line for per-frame routes that stop short, in the user's terms: frames, poses, actions."""
    frames = num_context + num_frames + skip
    missing = frames - given
    each = f" after {skip} context frames not used, and each of the {frames}" if skip else ", and each"
    return (f"{source}: gives {given} routes, {'one' if missing == 1 else missing} short: the rollout has "
            f"{num_context + num_frames} frames ({num_context} context + {num_frames} generated){each} needs its "
            f"route, frame 0 (the trajectory's first pose) to frame {frames - 1}, one more than the actions "
            f"({frames - 1}: the last leads into the last frame); give one route per pose and one for the frame after "
            "the last pose")


def rollout_requests(codes: np.ndarray, actions: np.ndarray, num_frames: int, seeds: Sequence[int],
                     overlap: int, routes: np.ndarray | None = None) -> list[RolloutRequest]:
    """One request per seed over one encoded context, with checked actions and routes (None: no route)."""
    return [RolloutRequest(codes, actions, num_frames, seed=seed, overlap=overlap, routes=routes) for seed in seeds]
