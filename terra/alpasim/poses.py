"""AlpaSim's rig poses → the actions of Terra's frames: one frame per pose, at Terra's 10 frames a second.

A pose is read as ``(x, y, yaw)`` in the rollout's local ENU frame (quaternion w first, timestamps in µs). Poses
must be 100 ms apart; beyond a chunk's last pose the car goes on at its last speed and yaw rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from terra.contract.actions import FRAME_RATE_HZ
from terra.core.errors import TerraInputError, past
from terra.inputs.actions import actions_from_value
from terra.inputs.ego_motion import compose, to_ego

FRAME_INTERVAL_US = round(1e6 / FRAME_RATE_HZ)  # 100_000: AlpaSim's frame_interval_us at fps=10
INTERVAL_TOLERANCE_US = 1_000  # timestamps may stray this far from the 100 ms grid
QUATERNION_TOLERANCE = 1e-3  # |norm - 1| of a rotation sent as float32
MAX_TILT_DEG = 30.0  # a rig whose z axis leans further from vertical is not a car on a road


@dataclass(frozen=True)
class Chunk:
    """A chunk of poses checked against a track: the actions of its frames, and where it leaves the track."""

    actions: np.ndarray  # [m, 6, 3] float32, actions[i] conditions the chunk's frame i
    last_us: int
    last_pose: np.ndarray  # (x, y, yaw) of the chunk's last frame


def planar_poses(vec: np.ndarray, quat_wxyz: np.ndarray) -> np.ndarray:
    """Rig poses (translations ``[N, 3]``, unit quaternions ``[N, 4]`` w first) → ``[N, 3]`` ``(x, y, yaw)``."""
    if not (np.all(np.isfinite(vec)) and np.all(np.isfinite(quat_wxyz))):
        bad = int(np.flatnonzero(~(np.isfinite(vec).all(1) & np.isfinite(quat_wxyz).all(1)))[0])
        raise TerraInputError(f"rig_trajectory pose {bad} holds NaN or inf; send finite poses")
    norms = np.linalg.norm(quat_wxyz, axis=1)
    off = np.flatnonzero(np.abs(norms - 1.0) > QUATERNION_TOLERANCE)
    if off.size:
        i = int(off[0])
        raise TerraInputError(f"rig_trajectory pose {i}: its quaternion has norm {norms[i]:.4g}; send a unit "
                              "quaternion (w, x, y, z) for the rig's rotation in the local frame")
    w, x, y, z = (quat_wxyz[:, k] / norms for k in range(4))
    up_z = 1.0 - 2.0 * (x * x + y * y)  # the rig's z axis, seen along the local z axis
    tilted = np.flatnonzero(up_z < math.cos(math.radians(MAX_TILT_DEG)))
    if tilted.size:
        i = int(tilted[0])
        raise TerraInputError(
            f"rig_trajectory pose {i} tilts the rig {past(math.degrees(math.acos(max(-1.0, up_z[i]))), MAX_TILT_DEG)} "
            "degrees from "
            f"level (at most {MAX_TILT_DEG:g}); send the rig's pose (x forward, y left, z up) in the local ENU "
            "frame, not a camera's")
    yaw = np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))
    return np.stack([vec[:, 0], vec[:, 1], yaw], axis=1).astype(np.float64)


def step_back(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The pose one step before ``first``, at the step from ``first`` to ``second``."""
    step = np.array([*to_ego(second[:2], first), second[2] - first[2]])
    return compose(first, np.array([*to_ego(np.zeros(2), step), -step[2]]))


class RigTrack:
    """Where a session's frames are: the last frame's time and pose, and how many were rendered."""

    def __init__(self) -> None:
        self.last_us: int | None = None
        self.last_pose: np.ndarray | None = None
        self.frames = 0  # frames rendered after the initial one

    def plan(self, times_us: np.ndarray, poses: np.ndarray) -> Chunk:
        """Check a chunk's timestamps ``[m]`` (µs) and planar ``poses`` ``[m, 3]`` against the track."""
        times_us = np.asarray(times_us, dtype=np.int64)
        if not len(times_us):
            raise TerraInputError("rig_trajectory holds no poses; send one pose per frame to render")
        first = self.last_us is None
        if first:
            previous = poses[0] if len(poses) == 1 else step_back(poses[0], poses[1])
            previous_us = int(times_us[0]) - FRAME_INTERVAL_US
        else:
            previous, previous_us = self.last_pose, self.last_us
        gaps = np.diff(np.concatenate([[previous_us], times_us]))
        off = np.flatnonzero(np.abs(gaps - FRAME_INTERVAL_US) > INTERVAL_TOLERANCE_US)
        if off.size:
            raise TerraInputError(self._gap_message(int(off[0]), times_us, previous_us, first))
        trajectory = {"x": [previous[0], *poses[:, 0]], "y": [previous[1], *poses[:, 1]],
                      "yaw": [previous[2], *poses[:, 2]], "t": (np.r_[previous_us, times_us] - previous_us) / 1e6}
        actions = actions_from_value({"trajectory": trajectory}, "rig_trajectory (from the previous frame's pose)",
                                     len(poses), min_frames=len(poses))
        return Chunk(actions, int(times_us[-1]), poses[-1].copy())

    def commit(self, chunk: Chunk) -> None:
        """Move the track to the end of a rendered chunk."""
        self.frames += len(chunk.actions)
        self.last_us, self.last_pose = chunk.last_us, chunk.last_pose

    @staticmethod
    def _gap_message(i: int, times_us: np.ndarray, previous_us: int, first: bool) -> str:
        gap = int(times_us[i] - (previous_us if i == 0 else times_us[i - 1]))
        if i == 0 and not first:
            return (f"rig_trajectory starts at {int(times_us[0])} us, but the last frame rendered is at "
                    f"{previous_us} us, so the next is at {previous_us + FRAME_INTERVAL_US} us (one pose per frame, "
                    f"{FRAME_INTERVAL_US} us apart)")
        fps = f" ({1e6 / gap:.3g} fps)" if gap > 0 else ""
        return (f"rig_trajectory poses {i - 1} and {i} are {gap} us apart{fps}; this server renders "
                f"{FRAME_RATE_HZ:g} frames a second, one pose per frame {FRAME_INTERVAL_US} us apart: set AlpaSim's "
                f"runtime.renderer.video_model_config.fps={FRAME_RATE_HZ:g}")
