"""What the gymnasium envs' agent sees, does and earns.

Observation: ``{"frame": uint8 [H, W, 3], "ego": [speed m/s, yaw rate rad/s, accel m/s^2], "command": Discrete(4)}``
(NAVSIM's command: 0 left, 1 straight, 2 right, 3 unknown).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.error import InvalidAction

from terra.closedloop.loop import Drive
from terra.closedloop.plans import COMMANDS, NAVSIM_POSES, Plan, as_plan
from terra.closedloop.car.motion import Actuation
from terra.closedloop.car.vehicle import VehicleParams
from terra.core.errors import TerraInputError, error_line, past
from terra.contract.actions import finite_array
from terra.inputs.ego_motion import to_ego
from terra.sim.scene import ROAD_HALF_WIDTH_M

ACTION_MODES = ("actuation", "plan")  # the envs' action_mode setting
REWARDS = ("progress", "lane_keeping")  # the envs' reward setting
LANE_PENALTY = 0.5  # lane_keeping: progress (m) lost per metre off the lane's centre, each step

# Plan action space bounds per pose: (x, y, heading).
PLAN_LOW = np.tile(np.array([0.0, -10.0, -np.pi], dtype=np.float32), (NAVSIM_POSES, 1))
PLAN_HIGH = np.tile(np.array([45.0, 10.0, np.pi], dtype=np.float32), (NAVSIM_POSES, 1))
# Bounds on speed (m/s), |yaw rate| (rad/s) and |acceleration| (m/s^2) any plan in the action space can command.
EGO_LIMIT = np.array([2000.0, 100.0, 20000.0], dtype=np.float32)


def observation_space(height: int, width: int) -> spaces.Dict:
    """One drive's observation space (the module docstring's)."""
    return spaces.Dict({
        "frame": spaces.Box(0, 255, (height, width, 3), np.uint8),
        "ego": spaces.Box(np.array([0.0, -EGO_LIMIT[1], -EGO_LIMIT[2]], np.float32), EGO_LIMIT),
        "command": spaces.Discrete(len(COMMANDS)),
    })


def checked_frame(frame: Any, size: tuple[int, int], world: str, call: str) -> np.ndarray:
    """``frame`` if it is what the observation's ``frame`` holds, uint8 ``[height, width, 3]``."""
    if type(frame) is np.ndarray and frame.dtype == np.uint8 and frame.shape == (*size, 3):
        return frame
    what = f"a {frame.dtype} frame of shape {list(frame.shape)}" if isinstance(frame, np.ndarray) else \
        f"a {type(frame).__name__}"
    raise TerraInputError(f"world {world}: {call} returned {what}; the env's frames are uint8 of shape "
                          f"{[*size, 3]} (its observation_space): fix the world, then reset()")


def observation(drive: Drive) -> dict[str, Any]:
    """What the agent of ``drive`` sees now; the frame a copy (users keep what they are given)."""
    obs = drive.observation(1)
    return {"frame": np.array(obs.frame, dtype=np.uint8),
            "ego": np.array([obs.ego.speed_mps, obs.ego.yaw_rate, obs.ego.accel_mps2], dtype=np.float32),
            "command": np.int64(COMMANDS.index(obs.ego.command))}


def action_space(mode: str) -> spaces.Box:
    """``actuation``: ``Box([-1, 1]^2)`` steering, acceleration; ``plan``: 8 ego poses (x, y, heading) at 0.5 s."""
    if mode == "actuation":
        return spaces.Box(-1.0, 1.0, (2,), np.float32)
    return spaces.Box(PLAN_LOW, PLAN_HIGH, dtype=np.float32)


def actuation_of(action: Any, params: VehicleParams) -> Actuation:
    """``[steering, acceleration]`` in ``[-1, 1]`` scaled by ``max_steer_rad`` (left +) and the accel limits."""
    arr = finite_array(action, "an actuation action")
    if arr.shape != (2,):
        raise TerraInputError(f"an actuation action is 2 numbers [steering, acceleration], got shape {list(arr.shape)}")
    if np.abs(arr).max() > 1.0:
        raise TerraInputError(f"an actuation action lies in [-1, 1], got {np.round(arr, 4).tolist()}")
    steer, accel = float(arr[0]), float(arr[1])
    return Actuation(steer * params.max_steer_rad, accel * (params.max_accel if accel >= 0 else -params.min_accel))


def read_action(mode: str, drive: Drive, action: Any, where: str = "action") -> tuple[Plan | Actuation, np.ndarray]:
    """A step's ``action`` in ``mode`` as the vehicle's command and the world model's action, or ``InvalidAction``."""
    try:
        if mode == "actuation":
            command = actuation_of(action, drive.vehicle.params)
        else:
            command = as_plan(np.asarray(action, dtype=np.float64) if isinstance(action, np.ndarray) else action)
            within_space(command)
        return command, drive.action_for(command)
    except (TerraInputError, TypeError, ValueError) as err:
        fix = ("give [steering, acceleration] in [-1, 1]" if mode == "actuation" else
               f"give {NAVSIM_POSES} poses (x, y, heading) at 0.5 s in the ego frame")
        raise InvalidAction(f"{where} is no {mode} action: {error_line(err)}; {fix}, as the action space says") \
            from None


def within_space(plan: Plan) -> None:
    """Refuse a plan whose poses leave the plan action space's bounds, naming the first such pose."""
    poses = plan.actions if plan.poses is None else plan.poses
    low, high = PLAN_LOW[0, : poses.shape[1]], PLAN_HIGH[0, : poses.shape[1]]
    outside = np.flatnonzero(~np.all((poses >= low) & (poses <= high), axis=1))
    if outside.size:
        k = int(outside[0])
        shown = ", ".join(past(v, high[i] if v > high[i] else low[i]) for i, v in enumerate(poses[k]))
        raise TerraInputError(f"plan pose {k} ({shown}) lies outside the action space (x {low[0]:g} to {high[0]:g} m, "
                              f"y {low[1]:g} to {high[1]:g} m, heading within pi)")


def reward_of(kind: str, before: np.ndarray, after: np.ndarray, truth: dict | None) -> float:
    """``progress``: metres forward along the old heading; ``lane_keeping``: metres along the road less
    :data:`LANE_PENALTY` times the distance from the lane's centre (synthetic scenarios only)."""
    if kind == "progress":
        return float(to_ego(after[:2], before)[0])
    offset = truth["mean_abs_lane_offset_m"]
    offset = ROAD_HALF_WIDTH_M if offset is None else offset  # off any lane: as far as the road's edge
    return float(truth["progress_along_road_m"] - LANE_PENALTY * offset)
