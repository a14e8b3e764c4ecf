"""Ego motion in the plane: poses, the frames they are given in, and how an action moves the car."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from terra.contract.actions import FRAME_RATE_HZ

Pose = tuple[float, float, float]
STRAIGHT = 1e-9  # a curvature (1/m) below this drives a straight line


def to_ego(points: Any, pose: Any) -> np.ndarray:
    """World points ``[..., 2]`` in the ego frame of world ``pose [..., 3]`` (broadcast)."""
    pose = np.asarray(pose, dtype=np.float64)
    c, s = np.cos(pose[..., 2]), np.sin(pose[..., 2])
    d = np.asarray(points, dtype=np.float64) - pose[..., :2]
    return np.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], axis=-1)


def to_world(points: Any, pose: Any) -> np.ndarray:
    """Points ``[..., 2]`` given in the ego frame of world ``pose`` ``[..., 3]``, in the world frame."""
    pose, points = np.asarray(pose, dtype=np.float64), np.asarray(points, dtype=np.float64)
    c, s = np.cos(pose[..., 2]), np.sin(pose[..., 2])
    x, y = points[..., 0], points[..., 1]
    return np.stack([pose[..., 0] + c * x - s * y, pose[..., 1] + s * x + c * y], axis=-1)


def compose(pose: Any, relative: Any) -> np.ndarray:
    """World poses ``[..., 3]`` of poses ``relative [..., 3]`` given in the ego frame of world ``pose``."""
    pose, relative = np.asarray(pose, dtype=np.float64), np.asarray(relative, dtype=np.float64)
    return np.concatenate([to_world(relative, pose), (pose[..., 2] + relative[..., 2])[..., None]], axis=-1)


def along_arc(curvature: float, distance: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, yaw)`` after ``distance`` m along the circle of ``curvature`` (1/m, left positive) from the origin."""
    distance = np.asarray(distance, dtype=np.float64)
    if abs(curvature) < STRAIGHT:
        return distance, np.zeros_like(distance), np.zeros_like(distance)
    heading = curvature * distance
    return np.sin(heading) / curvature, (1.0 - np.cos(heading)) / curvature, heading


def action_arc(action: np.ndarray) -> tuple[float, float, float]:
    """Curvature, length and time of the arc from the origin to the first point of an action ``[6, 3]``."""
    y0, x0, t0 = (float(v) for v in action[0])
    chord = math.hypot(x0, y0)
    if chord < 1e-6 or t0 <= 0:
        return 0.0, 0.0, max(t0, 1e-6)
    curvature = 2.0 * y0 / chord**2
    length = chord if abs(curvature) < STRAIGHT else 2.0 * math.atan2(y0, x0) / curvature
    return curvature, length, t0


def ego_motion(action: np.ndarray, dt: float = 1.0 / FRAME_RATE_HZ) -> Pose:
    """How far the car moves in ``dt`` under ``action``: ``(dx, dy, dyaw)`` in the current ego frame."""
    curvature, length, t0 = action_arc(action)
    return tuple(float(v) for v in along_arc(curvature, length / t0 * dt))


def speed_of(action: np.ndarray) -> float:
    """Speed in km/h an action starts with (arc length to its first point over its time)."""
    _, length, t0 = action_arc(action)
    return 3.6 * length / t0


def advance_pose(pose: Pose, action: np.ndarray) -> Pose:
    """The world pose ``(x, y, yaw)`` one frame later under ``action``."""
    return tuple(float(v) for v in compose(pose, ego_motion(action)))
