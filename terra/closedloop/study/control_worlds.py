"""Worlds known to be wrong: the controls that show the fidelity verdict can fail (terra/closedloop/study/verdict.py).

A verdict that passes the world model must fail each of these, or it cannot tell a world model from a broken one
(docs/fidelity.md). Each implements the :class:`~terra.closedloop.worlds.World` interface
and drives as any world does:

* ``frozen``: the last context frame, whatever the car does;
* ``gray``: uniform mid-gray frames, no lane ever visible;
* ``mirrored``: the true renders at the car's pose, mirrored left-right;
* ``late``: the true renders :data:`LATE_STEPS` steps (1 s) late: frame t shows the pose of step t - 10 (the start
  pose until then);
* ``offset_camera``: the true renders from a camera mounted :data:`CAMERA_OFFSET_M` (0.3 m) left of the car's
  centre line: a world that draws the road from a shifted viewpoint, which drives lane followers off the lane's
  centre (the lateral bias sees it);
* ``fast``: the true renders at a pose that runs :data:`FAST_FACTOR` (15 %) ahead along the road of the car's
  own progress, its lateral place and heading in the lane kept: a world whose video moves too fast (the forward
  following gain sees it);
* ``zero_actions``: the world model fed the action of a car standing still (every point of the 3 s path at the
  origin), whatever the car does;
* ``straight``: the world model fed the car's path straightened: each action point at its distance straight ahead,
  so the model renders driving straight at the commanded speed while the car steers.

The first six need the true world's scene (synthetic scenarios); the last two share the model world's
engine (they run after it, never beside it). :func:`control_world` builds one by name.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from terra.closedloop.scenarios import Scenario
from terra.closedloop.worlds import ModelWorld, TrueWorld
from terra.core.errors import TerraInputError

GRAY_LEVEL = 128
LATE_STEPS = 10  # 1 s at 10 Hz
CAMERA_OFFSET_M = 0.3  # offset_camera: the camera this far left of the car's centre line
FAST_FACTOR = 1.15  # fast: the world's progress along the road per metre of the car's
SCENE_CONTROLS = ("frozen", "gray", "mirrored", "late", "offset_camera", "fast")
MODEL_CONTROLS = ("zero_actions", "straight")
CONTROL_WORLDS = SCENE_CONTROLS + MODEL_CONTROLS
MODEL_WORLDS = ("model", *MODEL_CONTROLS)  # worlds whose frames the world model makes: its settings shape them


class FrozenWorld:
    """The scenario's last context frame forever."""

    name = "frozen"

    def __init__(self, image_size: Sequence[int]) -> None:
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.generate_s = 0.0
        self.decode_s = 0.0

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Scenario:
        return scenario

    def context_frames(self, drive: Scenario) -> np.ndarray:
        return drive.images

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return [drive.images[-1].copy() for drive in drives]

    def close(self, drive) -> None:
        pass


class GrayWorld(FrozenWorld):
    """Uniform mid-gray frames."""

    name = "gray"

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return [np.full((*self.image_size, 3), GRAY_LEVEL, dtype=np.uint8) for _ in drives]


class MirroredWorld(TrueWorld):
    """The true renders at the car's pose, mirrored left-right."""

    name = "mirrored"

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return [f if isinstance(f, BaseException) else np.ascontiguousarray(f[:, ::-1])
                for f in super().step(drives, actions, poses)]


class LateWorld(TrueWorld):
    """The true renders ``delay`` steps late: each step shows the pose the car had ``delay`` steps before (the
    start pose until then)."""

    name = "late"

    def __init__(self, image_size: Sequence[int], delay: int = LATE_STEPS) -> None:
        super().__init__(image_size)
        self.delay = delay

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> tuple[Any, list[np.ndarray]]:
        start = np.asarray(scenario.start_pose, dtype=np.float64)
        return super().open(scenario, seed, max_frames), [start] * self.delay

    def context_frames(self, drive) -> np.ndarray:
        return super().context_frames(drive[0])

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        shown = []
        for (_, past), pose in zip(drives, poses):
            past.append(np.asarray(pose, dtype=np.float64))
            shown.append(past.pop(0))
        return super().step([inner for inner, _ in drives], actions, shown)


def shifted_left(pose: np.ndarray, metres: float) -> np.ndarray:
    """``pose`` (x, y, yaw) moved ``metres`` to its own left (negative: right), its heading kept."""
    x, y, yaw = np.asarray(pose, dtype=np.float64)
    return np.array([x - metres * np.sin(yaw), y + metres * np.cos(yaw), yaw])


class OffsetCameraWorld(TrueWorld):
    """The true renders from a camera ``metres`` left of the car's centre line (negative: right)."""

    name = "offset_camera"

    def __init__(self, image_size: Sequence[int], metres: float = CAMERA_OFFSET_M) -> None:
        super().__init__(image_size)
        self.metres = metres

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return super().step(drives, actions, [shifted_left(pose, self.metres) for pose in poses])


class FastWorld(TrueWorld):
    """The true renders at the pose ``factor`` times as far along the road from the drive's start as the car is,
    at the car's lateral offset and heading against the road."""

    name = "fast"

    def __init__(self, image_size: Sequence[int], factor: float = FAST_FACTOR) -> None:
        super().__init__(image_size)
        self.factor = factor

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> tuple[Scenario, float]:
        start = np.asarray(scenario.start_pose, dtype=np.float64)
        drive = super().open(scenario, seed, max_frames)
        return drive, float(scenario.scene.road_coords(start[:1], start[1:2])[0][0])

    def context_frames(self, drive) -> np.ndarray:
        return super().context_frames(drive[0])

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        shown = []
        for (scenario, start), pose in zip(drives, poses):
            x, y, yaw = np.asarray(pose, dtype=np.float64)
            s, d = (v[0] for v in scenario.scene.road_coords(np.array([x]), np.array([y])))
            ahead = scenario.scene.lane_pose(start + self.factor * (s - start), d)
            shown.append(ahead + [0.0, 0.0, yaw - scenario.scene.road_pose(s)[2]])
        return super().step([scenario for scenario, _ in drives], actions, shown)


def standing_still(action: np.ndarray) -> np.ndarray:
    """The action of a car that stays where it is: every point at the origin, the times kept."""
    still = np.array(action, dtype=np.float32, copy=True)
    still[:, :2] = 0.0
    return still


def straightened(action: np.ndarray) -> np.ndarray:
    """The action's points each at its distance from the car, straight ahead (action columns: y, x, time)."""
    straight = np.array(action, dtype=np.float32, copy=True)
    straight[:, 1] = np.hypot(action[:, 0], action[:, 1])
    straight[:, 0] = 0.0
    return straight


class ActionControlWorld:
    """The world model (``model``, a :class:`~terra.closedloop.worlds.ModelWorld`) fed ``transform(action)``
    instead of the car's action; drives, context and decoding are the model world's."""

    def __init__(self, name: str, model: ModelWorld, transform: Callable[[np.ndarray], np.ndarray]) -> None:
        self.name, self.model, self.transform = name, model, transform
        self.generate_s = 0.0
        self.decode_s = 0.0

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Any:
        return self.model.open(scenario, seed, max_frames)

    def context_frames(self, drive) -> np.ndarray:
        return self.model.context_frames(drive)

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        generate, decode = self.model.generate_s, self.model.decode_s
        frames = self.model.step(drives, [self.transform(np.asarray(a)) for a in actions], poses)
        self.generate_s += self.model.generate_s - generate
        self.decode_s += self.model.decode_s - decode
        return frames

    def close(self, drive) -> None:
        self.model.close(drive)


def control_world(name: str, image_size: Sequence[int], model: ModelWorld | None = None):
    """The built-in control world ``name`` (:data:`CONTROL_WORLDS`); the model's controls need ``model``."""
    if name in MODEL_CONTROLS:
        if model is None:
            raise TerraInputError(f"the control world {name} is the world model fed other actions: it needs a model "
                                  "world")
        return ActionControlWorld(name, model, standing_still if name == "zero_actions" else straightened)
    return {"frozen": FrozenWorld, "gray": GrayWorld, "mirrored": MirroredWorld, "late": LateWorld,
            "offset_camera": OffsetCameraWorld, "fast": FastWorld}[name](image_size)
