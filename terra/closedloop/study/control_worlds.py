"""Worlds known to be wrong: the controls that show the fidelity verdict can fail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from terra.closedloop.scenarios import Scenario
from terra.closedloop.study.control_roads import fed_motion_road, foreign_road, no_road
from terra.closedloop.worlds import ModelWorld, Road, TrueWorld, pose_key

GRAY_LEVEL = 128
LATE_STEPS = 10  # 1 s at 10 Hz
CAMERA_OFFSET_M = 0.3  # offset_camera: the camera this far left of the car's centre line
SPEED_ERROR = 0.10  # fast / slow: the world's progress along the road per metre of the car's is 1 +- this
TURN_ERROR = 0.15  # over_turning / under_turning: the camera turns 1 +- this times as much as the car
STUTTER_PERIOD = 5  # stutter: every this many frames, the previous frame again


class FrozenWorld(TrueWorld):
    """The scenario's last context frame forever (a scenario of any kind: no scene is drawn)."""

    name = "frozen"

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Scenario:
        return scenario

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return [drive.images[-1].copy() for drive in drives]


class GrayWorld(FrozenWorld):
    """Uniform mid-gray frames."""

    name = "gray"

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return [np.full((*self.image_size, 3), GRAY_LEVEL, dtype=np.uint8) for _ in drives]


@dataclass
class ControlDrive:
    """A drive of a control world made of true renders: its scenario, the control's state and the renders it kept."""

    scenario: Scenario
    state: Any = None
    renders: dict[bytes, np.ndarray] = field(default_factory=dict)


class TrueControlWorld(TrueWorld):
    """A true world whose drives carry the control's state (:meth:`start`)."""

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> ControlDrive:
        return ControlDrive(super().open(scenario, seed, max_frames), self.start(scenario))

    def start(self, scenario: Scenario) -> Any:
        """The control's state at a drive's start (none)."""
        return None

    def context_frames(self, drive: ControlDrive) -> np.ndarray:
        return super().context_frames(drive.scenario)


class KeepingWorld(TrueControlWorld):
    """A control world whose drives keep the renders it makes (:meth:`rendered`) at poses the car reached."""

    def rendered(self, drives: Sequence[ControlDrive], poses: Sequence[np.ndarray]) -> list[np.ndarray | BaseException]:
        """The true renders at world ``poses`` the car reached, each kept on its drive."""
        frames = TrueWorld.step(self, [drive.scenario for drive in drives], None, poses)
        for drive, pose, frame in zip(drives, poses, frames):
            if not isinstance(frame, BaseException):
                drive.renders[pose_key(pose)] = frame
        return frames

    def true_renders(self, drive: ControlDrive) -> dict[bytes, np.ndarray]:
        return drive.renders


class MirroredWorld(KeepingWorld):
    """The true renders at the car's pose, mirrored left-right."""

    name = "mirrored"

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        return [f if isinstance(f, BaseException) else np.ascontiguousarray(f[:, ::-1])
                for f in self.rendered(drives, poses)]


class LateWorld(KeepingWorld):
    """The true renders :data:`LATE_STEPS` steps late."""

    name = "late"

    def start(self, scenario: Scenario) -> list[np.ndarray]:
        return [np.asarray(scenario.start_pose, dtype=np.float64)] * LATE_STEPS  # the poses shown next

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        for drive, pose in zip(drives, poses):
            drive.state.append(np.asarray(pose, dtype=np.float64))
        return self.rendered(drives, [drive.state.pop(0) for drive in drives])


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


class FastWorld(TrueControlWorld):
    """True renders ``factor`` times as far along the road from the start as the car is."""

    name, factor = "fast", 1.0 + SPEED_ERROR

    def start(self, scenario: Scenario) -> float:
        return scenario.scene.arc_length(scenario.start_pose)

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        shown = []
        for drive, pose in zip(drives, poses):
            x, y, yaw = np.asarray(pose, dtype=np.float64)
            scene, start = drive.scenario.scene, drive.state
            s, d = (v[0] for v in scene.road_coords(np.array([x]), np.array([y])))
            ahead = scene.lane_pose(start + self.factor * (s - start), d)
            shown.append(ahead + [0.0, 0.0, yaw - scene.road_pose(s)[2]])
        return super().step([drive.scenario for drive in drives], actions, shown)


class SlowWorld(FastWorld):
    name, factor = "slow", 1.0 - SPEED_ERROR


class TurningWorld(TrueControlWorld):
    """True renders from a camera that has turned ``factor`` times as much as the car since the start."""

    name, factor = "under_turning", 1.0 - TURN_ERROR

    def start(self, scenario: Scenario) -> list[float]:
        return [float(scenario.start_pose[2]), 0.0]  # the last yaw, the turn since the start

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        shown = []
        for drive, pose in zip(drives, poses):
            x, y, yaw = np.asarray(pose, dtype=np.float64)
            turn = drive.state
            turn[1] += float(np.angle(np.exp(1j * (yaw - turn[0]))))  # unwrapped
            turn[0] = yaw
            shown.append(np.array([x, y, yaw + (self.factor - 1.0) * turn[1]]))
        return super().step([drive.scenario for drive in drives], actions, shown)


class OverTurningWorld(TurningWorld):
    name, factor = "over_turning", 1.0 + TURN_ERROR


class StutterWorld(KeepingWorld):
    """The true renders, with every :data:`STUTTER_PERIOD`-th step's frame the previous frame again."""

    name = "stutter"

    def start(self, scenario: Scenario) -> list:
        return [0, scenario.images[-1]]  # steps, the last frame shown

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        frames = self.rendered(drives, poses)
        for k, (drive, frame) in enumerate(zip(drives, frames)):
            state = drive.state
            state[0] += 1
            if not isinstance(frame, BaseException):
                if state[0] % STUTTER_PERIOD == 0:  # the last frame again, the render kept as it is
                    frames[k] = frame = np.empty_like(frame)
                    frame[...] = state[1]
                state[1] = frame
        return frames


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


class ModelControlWorld:
    """The world model fed ``transform(action)`` (None: the action) and the routes of ``road_of(scenario)``."""

    def __init__(self, name: str, model: ModelWorld, transform: Callable[[np.ndarray], np.ndarray] | None,
                 road_of: Callable[[Scenario], Road]) -> None:
        self.name, self.model, self.transform, self.road_of = name, model, transform, road_of
        self.generate_s = 0.0
        self.decode_s = 0.0

    def open(self, scenario: Scenario, seed: int, max_frames: int) -> Any:
        return self.model.open(scenario, seed, max_frames, self.road_of(scenario))

    def context_frames(self, drive) -> np.ndarray:
        return self.model.context_frames(drive)

    def reference_frames(self, drive) -> np.ndarray | None:
        return self.model.reference_frames(drive)

    def true_renders(self, drive) -> dict[bytes, np.ndarray] | None:
        return self.model.true_renders(drive)

    def route_source(self, drive) -> str | None:
        return self.model.route_source(drive)

    def route_told(self, drive) -> list[str] | None:
        return self.model.route_told(drive)

    def close(self, drive) -> None:
        self.model.close(drive)

    def step(self, drives, actions, poses) -> list[np.ndarray | BaseException]:
        generate, decode = self.model.generate_s, self.model.decode_s
        if self.transform is not None:
            actions = [self.transform(np.asarray(a)) for a in actions]
        frames = self.model.step(drives, actions, poses)
        self.generate_s += self.model.generate_s - generate
        self.decode_s += self.model.decode_s - decode
        return frames


SCENE_CONTROLS: dict[str, Callable[[Sequence[int]], Any]] = {  # name -> its builder from the frame size
    "frozen": FrozenWorld, "gray": GrayWorld, "mirrored": MirroredWorld, "late": LateWorld,
    "offset_camera": OffsetCameraWorld, "fast": FastWorld, "slow": SlowWorld, "under_turning": TurningWorld,
    "over_turning": OverTurningWorld, "stutter": StutterWorld,
}
ROUTE_CONTROLS: dict[str, Callable[[Scenario], Road]] = {  # name -> the road a drive's routes are read from
    "wrong_route": foreign_road, "no_route": no_road,
}
MODEL_CONTROLS: dict[str, tuple[Callable[[np.ndarray], np.ndarray] | None, Callable[[Scenario], Road]]] = {
    "zero_actions": (standing_still, fed_motion_road(False)), "straight": (straightened, fed_motion_road(True)),
    **{name: (None, road_of) for name, road_of in ROUTE_CONTROLS.items()},
}  # name -> what the model is fed for an action (None: the action), and the road its routes are read from
CONTROL_WORLDS = (*SCENE_CONTROLS, *MODEL_CONTROLS)
MODEL_WORLDS = ("model", *MODEL_CONTROLS)  # worlds whose frames the world model makes


def control_world(name: str, image_size: Sequence[int], model: ModelWorld | None = None):
    """The built-in control world ``name`` (:data:`CONTROL_WORLDS`); the model's controls need ``model``."""
    if name in MODEL_CONTROLS:
        return ModelControlWorld(name, model, *MODEL_CONTROLS[name])
    return SCENE_CONTROLS[name](image_size)
