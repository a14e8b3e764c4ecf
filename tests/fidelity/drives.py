"""Drives in the synthetic world for the fidelity tests: poses that speed up, slow down and weave in the lane, the
true renders along them, and the broken worlds made from those renders (frozen, gray, mirrored, late)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from terra.sim.renderer import render
from terra.sim.scene import Scene

HEIGHT, WIDTH = 144, 256


@lru_cache(maxsize=8)
def weaving_drive(seed: int, steps: int) -> tuple[Scene, np.ndarray, np.ndarray]:
    """A scene, world poses ``[steps + 1, 3]`` at 10 Hz (speed 6-12 m/s, the lane centre +- 0.6 m) and the true
    renders ``uint8 [steps + 1, H, W, 3]`` at them (frame 0 the drive's start)."""
    scene = Scene.generate(seed)
    rng = np.random.default_rng(seed)
    t = np.arange(steps + 1) * 0.1
    speed = 9.0 + 3.0 * np.sin(2 * np.pi * t / 4.7 + rng.uniform(0, 2 * np.pi))
    s = rng.uniform(30.0, 250.0) + np.concatenate([[0.0], np.cumsum(speed[:-1] * 0.1)])
    phase = rng.uniform(0, 2 * np.pi)
    d = scene.ego_lane_offset_m + 0.6 * np.sin(2 * np.pi * t / 3.3 + phase)
    d_rate = 0.6 * 2 * np.pi / 3.3 * np.cos(2 * np.pi * t / 3.3 + phase)
    poses = scene.lane_pose(s, d)
    poses[:, 2] += np.arctan2(d_rate, speed)
    frames = np.stack([render(scene, pose, HEIGHT, WIDTH) for pose in poses])
    frames.setflags(write=False)
    poses.setflags(write=False)
    return scene, poses, frames


def frozen(frames: np.ndarray) -> np.ndarray:
    """Every frame is the first (the last context frame forever)."""
    return np.broadcast_to(frames[:1], frames.shape)


def gray(frames: np.ndarray) -> np.ndarray:
    """Uniform mid-gray frames."""
    return np.full_like(frames, 128)


def mirrored(frames: np.ndarray) -> np.ndarray:
    """The true frames mirrored left-right."""
    return frames[:, :, ::-1]


def late(frames: np.ndarray, steps: int) -> np.ndarray:
    """The true frames ``steps`` late: frame t shows the true frame t - steps (the first frame until then)."""
    return frames[np.maximum(np.arange(len(frames)) - steps, 0)]
