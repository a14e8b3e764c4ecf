"""Recovery clips: a long drive whose first frames are seen from a camera off the car's pose, the rest on it.

Poses, actions and routes are the car's throughout, so only the route says where the road truly is."""

from __future__ import annotations

import dataclasses

import numpy as np

from terra.contract.layout import DEFAULT_OVERLAP
from terra.sim.clips import Drive
from terra.sim.long_drives import random_long_drive

CONTEXT_FRAMES = DEFAULT_OVERLAP  # a window's context: the fewest frames seen from the offset camera
LATERAL_SD_M, MAX_LATERAL_M = 0.8, 2.0  # the camera's sideways offset: normal, clipped
YAW_SD_DEG, MAX_YAW_DEG = 3.5, 9.0  # and its turn


def camera_offset(rng: np.random.Generator) -> np.ndarray:
    """One context's camera offset ``(forward, left, yaw)`` in the car's frame (m, m, rad): forward 0."""
    left = float(np.clip(rng.normal(0.0, LATERAL_SD_M), -MAX_LATERAL_M, MAX_LATERAL_M))
    yaw = float(np.clip(rng.normal(0.0, YAW_SD_DEG), -MAX_YAW_DEG, MAX_YAW_DEG))
    return np.array([0.0, left, np.radians(yaw)])


def random_recovery(rng: np.random.Generator, num_frames: int, domain: str = "day") -> Drive:
    """A long drive whose first :data:`CONTEXT_FRAMES` to ``num_frames - 1`` frames are seen from one camera offset."""
    drive = random_long_drive(rng, num_frames, domain)
    offset = camera_offset(rng)
    off_pose = int(rng.integers(CONTEXT_FRAMES, num_frames))
    offsets = np.zeros((num_frames, 3))
    offsets[:off_pose] = offset
    name = f"recovery({offset[1]:+.2f}m,{np.degrees(offset[2]):+.1f}deg,{off_pose}f):{drive.manoeuvre}"
    return dataclasses.replace(drive, manoeuvre=name, camera_offsets=offsets)
