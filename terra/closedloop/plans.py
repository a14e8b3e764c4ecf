"""What a policy sees and returns: :class:`Observation` in, :class:`Plan` out."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from terra.contract.actions import finite_array, in_reach
from terra.core.errors import TerraInputError, past
from terra.inputs.ego_motion import to_ego

NAVSIM_DT_S = 0.5  # NAVSIM's trajectory sampling: 8 poses over 4 s
NAVSIM_POSES = 8
COMMANDS = ("left", "straight", "right", "unknown")  # NAVSIM's driving command, one-hot in this order
MAX_POSITION_M = 1e7  # |x|, |y| (and |heading|, rad) of a plan's poses: beyond it nonsense that overflows geometry
MIN_QUATERNION_NORM = 1e-6  # below it a pose's quaternion is no rotation (carla_driver_interface reads it as none)


@dataclass(frozen=True)
class Plan:
    """A policy's plan: ``poses [N, 2|3]`` (x, y[, heading]) at ``times [N]`` s after now, or ``actions [6, 3]``."""

    poses: np.ndarray | None = None
    times: np.ndarray | None = None
    actions: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.actions is not None:
            actions = _array(self.actions, "plan actions")
            if actions.shape != (6, 3) or self.poses is not None:
                raise TerraInputError(f"plan actions must have shape [6, 3] and come alone, got {list(actions.shape)}")
            in_reach(finite_array(actions, "plan actions"), "plan actions")
            object.__setattr__(self, "actions", _frozen(actions))
            return
        poses = _array(self.poses, "plan poses")
        if poses.ndim != 2 or poses.shape[1] not in (2, 3) or not len(poses):
            raise TerraInputError(f"plan poses must have shape [N, 2|3] (x, y[, heading]), got {list(poses.shape)}")
        _check_poses(poses)
        times = _array(self.times, "plan times").reshape(-1)
        if len(times) != len(poses) or not np.all(np.isfinite(times)) or times[0] <= 0 or np.any(np.diff(times) <= 0):
            raise TerraInputError(f"plan times must be {len(poses)} increasing seconds after now, the first above 0")
        object.__setattr__(self, "poses", _frozen(poses))
        object.__setattr__(self, "times", _frozen(times))

    @classmethod
    def trajectory(cls, poses: Any, dt: float = NAVSIM_DT_S, times: Any = None) -> "Plan":
        """Poses ``[N, 2|3]`` (heading along the path when left out) at ``dt, 2 dt, ...`` or at ``times``."""
        poses = _array(poses, "plan poses")
        return cls(poses=poses, times=np.arange(1, len(poses) + 1) * float(dt) if times is None else times)

    @classmethod
    def from_quaternions(cls, positions: Any, quaternions: Any, times: Any, origin: Any) -> "Plan":
        """The ego-frame plan of ``positions [N, 2|3]`` and ``quaternions [N, 4]`` (x, y, z, w) seen from ``origin``."""
        from scipy.spatial.transform import Rotation

        positions, quaternions = _array(positions, "plan positions"), _array(quaternions, "plan quaternions")
        if positions.ndim != 2 or positions.shape[1] not in (2, 3) or quaternions.shape != (len(positions), 4):
            raise TerraInputError(f"plan positions [N, 2|3] and quaternions [N, 4] must come in pairs, got "
                                  f"{list(positions.shape)} and {list(quaternions.shape)}")
        _check_poses(positions)
        for k, quaternion in enumerate(quaternions.tolist()):
            norm = math.hypot(*quaternion)
            if not (math.isfinite(norm) and norm >= MIN_QUATERNION_NORM):
                raise TerraInputError(f"plan pose {k} has a degenerate rotation (a quaternion of norm {norm:g}); "
                                      "give unit quaternions")
        yaws = Rotation.from_quat(quaternions).as_euler("ZYX")[:, 0] - float(origin[2])
        return cls(poses=np.c_[to_ego(positions[:, :2], origin), np.arctan2(np.sin(yaws), np.cos(yaws))], times=times)

    def to_json(self) -> dict:
        if self.actions is not None:
            return {"actions": np.round(self.actions, 4).tolist()}
        return {"times": np.round(self.times, 4).tolist(), "poses": np.round(self.poses, 4).tolist()}


def as_plan(value: Any) -> Plan:
    """A policy's answer as a new :class:`Plan` (a Plan given is copied: changing it later changes no record)."""
    if isinstance(value, Plan):
        return Plan(poses=value.poses, times=value.times, actions=value.actions)
    if isinstance(value, dict):
        if "actions" in value:
            return Plan(actions=value["actions"])
        return Plan.trajectory(value.get("poses"), float(value.get("dt", NAVSIM_DT_S)), value.get("times"))
    arr = _array(value, "a plan")
    if arr.shape == (6, 3):
        return Plan(actions=arr)
    if arr.ndim == 2 and arr.shape[1] in (2, 3) and len(arr) == NAVSIM_POSES:
        return Plan.trajectory(arr, NAVSIM_DT_S)
    raise TerraInputError(f"a plan array must be [6, 3] actions or [{NAVSIM_POSES}, 3] poses at {NAVSIM_DT_S} s "
                          f"(got shape {list(arr.shape)}); return a Plan for other timings")


def _array(value: Any, what: str) -> np.ndarray:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise TerraInputError(f"{what} must be an array of numbers (got {type(value).__name__})") from None


def _check_poses(poses: np.ndarray) -> None:
    """Refuse poses ``[N, 2|3]`` that are not finite or lie beyond :data:`MAX_POSITION_M`, naming the first."""
    bad = ~np.all(np.isfinite(poses) & (np.abs(poses) <= MAX_POSITION_M), axis=1)
    if bad.any():
        k = int(np.argmax(bad))
        shown = ", ".join(past(v, MAX_POSITION_M if v >= 0 else -MAX_POSITION_M) for v in poses[k].tolist())
        raise TerraInputError(f"plan pose {k} is ({shown}), not finite numbers within {MAX_POSITION_M:g} m (and "
                              "rad); give poses in the car's frame, in metres")


def _frozen(values: np.ndarray) -> np.ndarray:
    """A read-only copy of ``values``: the plan's own."""
    owned = np.array(values, dtype=np.float64)
    owned.flags.writeable = False
    return owned


@dataclass(frozen=True)
class EgoStatus:
    """The ego car's state at a frame, as the policy is told it."""

    speed_mps: float
    yaw_rate: float  # rad/s, left positive
    accel_mps2: float  # along the heading
    command: str = "unknown"  # one of COMMANDS: where the route goes

    def command_one_hot(self) -> np.ndarray:
        return (np.array(COMMANDS) == self.command).astype(np.int64)


@dataclass(frozen=True)
class Observation:
    """What a policy gets each step."""

    step: int  # plans made before this one in the drive
    time_s: float  # since the last context frame
    frames: tuple[np.ndarray, ...]  # uint8 [H, W, 3], oldest first, the newest last
    ego: EgoStatus
    history: tuple[EgoStatus, ...]  # ego states of the drive's newest frames, oldest first (the last is ``ego``)
    past_poses: np.ndarray  # [len(history), 3] their poses in the newest frame's ego frame (the last is 0, 0, 0)
    route: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # [M, 2] the route ahead, ego frame
    pose: np.ndarray = field(default_factory=lambda: np.zeros(3))  # the newest frame's pose in the drive's frame

    @property
    def frame(self) -> np.ndarray:
        return self.frames[-1]


class Policy(Protocol):
    """A driving policy: one instance per drive. :meth:`plan` returns anything :func:`as_plan` reads."""

    name: str

    def reset(self, scenario: Any) -> None:
        """Called once, before the drive's first plan, with its :class:`~terra.closedloop.scenarios.Scenario`."""

    def plan(self, observation: Observation) -> Any:
        """The plan for the next frame."""

    def close(self) -> None:
        """Called once when the drive ends (also when it failed)."""


def policy_seed(seed: int, scenario_id: str, policy: str) -> int:
    """A drive's policy seed: 64 bits of SHA-256 of the run's ``seed``, the scenario id and the policy name."""
    digest = hashlib.sha256(f"{seed}\0{scenario_id}\0{policy}".encode()).digest()
    return int.from_bytes(digest[:8], "little")
