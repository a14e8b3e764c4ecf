"""Where a session starts: context frames as codes, the actions between them and the speed at the last one.

``actions[t]`` conditions context frame ``t + 1``, so ``n`` context frames carry ``n - 1`` actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from terra.core.errors import TerraInputError
from terra.contract.actions import validate_actions
from terra.contract.routes import NO_LANE_NEAR, NONE_GIVEN, TOLD
from terra.inputs.routes import road_of_setting, told_road_routes
from terra.inputs.trajectory import MANOEUVRES
from terra.inputs.ego_motion import advance_pose, compose, speed_of, to_ego
from terra.roads import Road, told_route_at
from terra.session.driver_input import MAX_SPEED_KMH, check_number, drive_action
from terra.sim import Scene, builtin_context, builtin_road
from terra.tokenizer.images import load_images


ROAD_SUFFIXES = (".json", ".csv", ".zip")  # the road files a server's roads folder holds
OWN_ROAD = "own road"  # a session told its context's own road: the built-in world's scene, none for images and codes


@dataclass
class SessionContext:

    codes: np.ndarray  # [n, h, w] int64
    actions: np.ndarray  # [n - 1, 6, 3] float32
    speed_kmh: float  # at the last context frame; key driving starts from it
    source: str  # a short description for listings
    scene: Scene | None = None  # the built-in world's scene: the road a route model is told of
    poses: np.ndarray | None = None  # [n, 3] world poses of the context frames in ``scene``
    road: Road | None = None  # a road the client gave, in the session frame (the last context frame's ego frame)

    @property
    def route_source(self) -> str | None:
        """Where the routes come from: ``road`` (given), ``scene``, or None where no road is known."""
        return "road" if self.road is not None else None if self.scene is None else "scene"

    def context_routes(self, route_tokens: int) -> np.ndarray | None:
        """The context frames' routes ``[n, K, 3]``; None without a road."""
        if self.road is not None:
            return told_road_routes(self.road, session_poses(self.actions), route_tokens, "road")[0]
        return None if self.scene is None else self.scene.route(self.poses, route_tokens)

    def step_route(self, pose: np.ndarray, route_tokens: int) -> tuple[np.ndarray | None, str]:
        """The route ``[K, 3]`` at session-frame ``pose`` (None: no road) and its verdict (``TOLD`` or why not)."""
        if self.road is not None:
            return told_route_at(self.road, pose, route_tokens)
        if self.scene is None:
            return None, NONE_GIVEN
        route = self.scene.route(compose(self.poses[-1], pose), route_tokens)
        return route, TOLD if np.isfinite(route).all() else NO_LANE_NEAR


def named_roads(folder: str | Path | None) -> dict[str, Road]:
    """The road files in ``folder`` (``.json``, ``.csv``, a clipgt ``.zip``), each read and checked, by file stem."""
    if folder is None:
        return {}
    roads: dict[str, Road] = {}
    for path in sorted(Path(folder).expanduser().iterdir()):
        if path.suffix.lower() not in ROAD_SUFFIXES or not path.is_file():
            continue
        if path.stem in roads:
            raise TerraInputError(f"{path.parent}: two road files are named {path.stem!r:.60}; rename one")
        roads[path.stem] = road_of_setting(str(path), f"road {path.name}")
    return roads


def session_poses(actions: np.ndarray) -> np.ndarray:
    """The session-frame poses ``[n, 3]`` of the context frames that ``actions`` ``[n - 1, 6, 3]`` lead through."""
    world = np.asarray(list(accumulate(actions, advance_pose, initial=(0.0, 0.0, 0.0))))
    return np.column_stack([to_ego(world[:, :2], world[-1]), world[:, 2] - world[-1, 2]])


def _context_actions(actions: Any, num_context: int, speed_kmh: float) -> np.ndarray:
    """The actions between ``num_context`` frames: the last ``num_context - 1`` rows given, or straight driving."""
    if actions is None:
        return np.repeat(drive_action(0.0, speed_kmh)[None], num_context - 1, axis=0)
    actions = validate_actions(actions, "context actions", num_context - 1)
    return actions[len(actions) - (num_context - 1):] if num_context > 1 else actions[:0]


def builtin(pipeline, num_context: int, manoeuvre: str = "straight", scene: int = 0,
            speed_kmh: float = 30.0) -> SessionContext:
    """Context rendered by the synthetic world: scene ``scene`` driven by ``manoeuvre`` at ``speed_kmh``."""
    if manoeuvre not in MANOEUVRES:
        raise TerraInputError(f"unknown manoeuvre {manoeuvre!r}; choose one of: {', '.join(MANOEUVRES)}")
    if isinstance(scene, bool) or not isinstance(scene, int) or not 0 <= scene < 2**31:
        raise TerraInputError(f"scene must be a whole number in [0, 2**31) (got {scene!r})")
    speed = check_number(speed_kmh, "speed_kmh", 1.0, MAX_SPEED_KMH)
    params = {"speed_kmh": speed}
    images, actions = builtin_context(manoeuvre, num_context, pipeline.image_size, scene, params)
    world, poses = builtin_road(manoeuvre, num_context, scene, params)
    return SessionContext(pipeline.encode(images), actions[: num_context - 1], speed_of(actions[-1]),
                          f"built-in {manoeuvre}, scene {scene}", world, poses)


def from_images(pipeline, images: torch.Tensor | Sequence[Any], num_context: int | None = None,
                actions: Any = None, speed_kmh: float = 30.0, resize: str = "crop") -> SessionContext:
    """Context from the last ``num_context`` of a tensor ``[N, 3, H, W]`` in [-1, 1], files, PIL images or arrays."""
    if not torch.is_tensor(images):
        images = load_images(list(images), pipeline.image_size, last_n=num_context, resize=resize)
    elif num_context is not None:
        images = images[-num_context:]
    speed = check_number(speed_kmh, "speed_kmh", 0.0, MAX_SPEED_KMH)
    codes = pipeline.encode(images)
    return SessionContext(codes, _context_actions(actions, len(codes), speed), speed,
                          f"{len(codes)} image{'s' if len(codes) > 1 else ''}")


def from_codes(codes: Any, grid: tuple[int, int], actions: Any = None, speed_kmh: float = 30.0) -> SessionContext:
    """Context from image codes ``[N, h, w]`` or ``[N, h * w]`` (checked against the model when the session opens)."""
    try:
        arr = np.asarray(codes)
    except (TypeError, ValueError):
        arr = np.zeros(0)
    if arr.ndim not in (2, 3) or not len(arr) or not np.issubdtype(arr.dtype, np.integer):
        raise TerraInputError(f"context codes must be whole numbers of shape [frames, {grid[0]}, {grid[1]}] "
                              f"or [frames, {grid[0] * grid[1]}] (got {list(arr.shape)} of {arr.dtype})")
    if arr[0].size != grid[0] * grid[1]:
        raise TerraInputError(f"context codes have {arr[0].size} codes per frame but the tokenizer's grid is "
                              f"{grid[0]}x{grid[1]}; encode the frames with the tokenizer that matches the model")
    speed = check_number(speed_kmh, "speed_kmh", 0.0, MAX_SPEED_KMH)
    arr = arr.reshape(len(arr), *grid).astype(np.int64)
    return SessionContext(arr, _context_actions(actions, len(arr), speed), speed, f"{len(arr)} frames of codes")
