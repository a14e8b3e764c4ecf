"""Recovery clips: a world model's frames seen from off the car's pose for a while, then on it again.

In a long rollout a world model draws the road from its own frames, and they drift from where the car truly is:
the road shows a little too far left, or turned. Taught on true frames only, a model never sees its frames
disagree with the car's pose, so it learns to continue them and has no use for a route: the route tells it nothing
its true frames do not (benchmarks/training.md, "Route reading on the CPU"). A recovery clip is a long drive's
stretch (terra/sim/long_drives.py) whose first frames (at least a rollout window's context,
terra/contract/layout.py, and up to all but the last: the drift shows at any position of a window) are rendered
from a camera moved sideways and turned by one offset, and whose later frames are rendered on the car's pose again;
poses, actions and routes are the car's throughout. The first frame back on the pose is where the offset goes:
only the route (the road ahead in the car's frame) says where the road truly is. A model trained on such clips
(``data.recoveries``, terra/training/data.py) is trained on the frames from that one on, never on the frames seen
from off the pose, so it learns to draw the road where its route says, whatever its earlier frames showed.
"""

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
    """A long drive of ``num_frames`` frames whose first frames (uniformly :data:`CONTEXT_FRAMES` to
    ``num_frames - 1`` of them) are seen from one camera offset (:func:`camera_offset`), the rest from the car's
    pose; its name says the offset and how many frames it lasts. ``num_frames`` exceeds :data:`CONTEXT_FRAMES`
    (terra/sim/dataset.py checks it)."""
    drive = random_long_drive(rng, num_frames, domain)
    offset = camera_offset(rng)
    off_pose = int(rng.integers(CONTEXT_FRAMES, num_frames))
    offsets = np.zeros((num_frames, 3))
    offsets[:off_pose] = offset
    name = f"recovery({offset[1]:+.2f}m,{np.degrees(offset[2]):+.1f}deg,{off_pose}f):{drive.manoeuvre}"
    return dataclasses.replace(drive, manoeuvre=name, camera_offsets=offsets)
