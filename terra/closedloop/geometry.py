"""Poses in the plane: ``(x, y, yaw)`` in metres and radians, world or ego frame (x forward, y left).

The one place the wing moves points between frames: a drive's poses start at its scenario's start pose
(terra/closedloop/loop.py), routes and policies work in the ego frame (terra/closedloop/scenarios.py, plans.py).
"""

from __future__ import annotations

import numpy as np


def to_ego(points: np.ndarray, pose: np.ndarray) -> np.ndarray:
    """World points ``[M, 2]`` in the ego frame of ``pose``."""
    c, s = np.cos(pose[2]), np.sin(pose[2])
    d = np.asarray(points, dtype=np.float64) - pose[:2]
    return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]], axis=-1)


def compose(pose: np.ndarray, relative: np.ndarray) -> np.ndarray:
    """World poses ``[..., 3]`` of poses ``relative [..., 3]`` given in the ego frame of world ``pose``."""
    relative = np.asarray(relative, dtype=np.float64)
    c, s = np.cos(pose[2]), np.sin(pose[2])
    x, y = relative[..., 0], relative[..., 1]
    return np.stack([pose[0] + c * x - s * y, pose[1] + s * x + c * y, pose[2] + relative[..., 2]], axis=-1)
