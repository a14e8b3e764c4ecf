"""What a policy sees and returns: :class:`Observation` in, :class:`Plan` out.

A plan is the ego car's future in the ego frame of the newest frame (x forward, y left, heading counter-clockwise,
metres, radians, seconds after now; the origin is the rear axle's centre, as in NAVSIM's ego frame and AlpaSim's
rig): a trajectory of poses (NAVSIM's 8 poses at 0.5 s, AlpaSim's rig-frame trajectory at 10 Hz, or any other
timestamps), or the world model's own ``[6, 3]`` action (its points at the action times). The drive's vehicle
follows it (terra/closedloop/motion.py, reading it as terra/closedloop/reference.py does), and the world model is
shown the motion the vehicle forecasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from terra.core.errors import TerraInputError

NAVSIM_DT_S = 0.5  # NAVSIM's trajectory sampling: 8 poses over 4 s
NAVSIM_POSES = 8
COMMANDS = ("left", "straight", "right", "unknown")  # NAVSIM's driving command, one-hot in this order


@dataclass(frozen=True)
class Plan:
    """A policy's plan: ``poses [N, 2|3]`` (x, y[, heading]) at ``times [N]`` seconds after now, or ``actions
    [6, 3]``. Shapes and times are checked when it is built; the numbers when a vehicle reads it
    (terra/closedloop/reference.py)."""

    poses: np.ndarray | None = None
    times: np.ndarray | None = None
    actions: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.actions is not None:
            actions = _array(self.actions, "plan actions")
            if actions.shape != (6, 3) or self.poses is not None:
                raise TerraInputError(f"plan actions must have shape [6, 3] and come alone, got {list(actions.shape)}")
            object.__setattr__(self, "actions", actions)
            return
        poses = _array(self.poses, "plan poses")
        if poses.ndim != 2 or poses.shape[1] not in (2, 3) or not len(poses):
            raise TerraInputError(f"plan poses must have shape [N, 2|3] (x, y[, heading]), got {list(poses.shape)}")
        times = _array(self.times, "plan times").reshape(-1)
        if len(times) != len(poses) or not np.all(np.isfinite(times)) or times[0] <= 0 or np.any(np.diff(times) <= 0):
            raise TerraInputError(f"plan times must be {len(poses)} increasing seconds after now, the first above 0")
        object.__setattr__(self, "poses", poses)
        object.__setattr__(self, "times", times)

    @classmethod
    def trajectory(cls, poses: Any, dt: float = NAVSIM_DT_S, times: Any = None) -> "Plan":
        """Poses ``[N, 2|3]`` (heading along the path when left out) at ``dt, 2 dt, ...`` or at ``times``."""
        poses = _array(poses, "plan poses")
        return cls(poses=poses, times=np.arange(1, len(poses) + 1) * float(dt) if times is None else times)

    def to_json(self) -> dict:
        if self.actions is not None:
            return {"actions": np.round(self.actions, 4).tolist()}
        return {"times": np.round(self.times, 4).tolist(), "poses": np.round(self.poses, 4).tolist()}


def as_plan(value: Any) -> Plan:
    """A policy's answer as a :class:`Plan`: a Plan (as it is), an action array ``[6, 3]``, NAVSIM-like poses
    ``[8, 2|3]`` at 0.5 s, or a mapping ``{"poses": [N, 2|3], "times": [N]}`` (or ``"dt"``) or
    ``{"actions": [6, 3]}``."""
    if isinstance(value, Plan):
        return value
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
