"""Clips of the synthetic world at 10 Hz: rendered frames with exact poses, instruction trajectories, actions, routes.
"""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from terra.core.errors import TerraInputError
from terra.contract.actions import FRAME_RATE_HZ, FUTURE_POINTS, FUTURE_RATE_HZ
from terra.inputs.actions import actions_from_instruction_trajs
from terra.inputs.ego_motion import compose
from terra.inputs.trajectory import FOLLOW_LANE, EgoTrajectory, MANOEUVRES, manoeuvre_trajectory
from terra.sim.renderer import render
from terra.sim.scene import EGO_LANE_OFFSET_M, LANE_WIDTH_M, Scene

FUTURE_S = FUTURE_POINTS / FUTURE_RATE_HZ  # 3 s of future needed by the last frame's instruction trajectory
SAMPLE_RATE_HZ = 100.0  # resolution of synthesised trajectories
SCENE_LENGTH_M = 600.0
VIEW_MARGIN_M = 150.0  # road kept ahead of the last frame so the road's end stays in the haze
DATASET_ROUTE_POINTS = 16  # a clip's routes: every 5 m up to 80 m


@dataclass(frozen=True)
class Clip:
    """A rendered clip and its exact ground truth (frames at 10 Hz)."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    poses: np.ndarray  # float64 [T, 3] world x, y, yaw of each frame
    instruction_trajs: np.ndarray  # float32 [T, 60, 3] ACT-Bench future trajectories in each frame's ego frame
    actions: np.ndarray  # float32 [T, 6, 3] the world model's actions ([y, x, time] per slot)
    manoeuvre: str  # a name from terra.inputs.trajectory.MANOEUVRES, "follow_lane", or "straight>NAME"
    seed: int  # scene seed: Scene.generate(seed, scene_length_m) rebuilds the scene
    start_s: float  # arc length of the road pose the clip starts at
    speed_kmh: float  # initial speed
    scene_length_m: float = SCENE_LENGTH_M
    domain: str = "day"  # the scene's, terra.sim.scene.DOMAINS
    routes: np.ndarray | None = None  # float32 [T, 16, 3] each frame's route (Scene.route at its pose); None: a
    # dataset written before clips carried routes
    off_pose_frames: int = 0  # the first frames seen from off the car's pose

    @property
    def num_frames(self) -> int:
        return len(self.frames)


@dataclass(frozen=True)
class Drive:
    """A drive drawn by :func:`random_drive`, not rendered yet: its scene and world-frame trajectory."""

    scene: Scene
    trajectory: EgoTrajectory  # from the first frame to FUTURE_S past the last
    manoeuvre: str
    start_s: float
    speed_kmh: float
    camera_offsets: np.ndarray | None = None  # [T, 3] (forward, left, yaw) of the camera in the car's frame per
    # frame; None: the camera is on the car's pose

    def render(self, num_frames: int, height: int, width: int) -> Clip:
        """The drive's first ``num_frames`` frames at 10 Hz with their ground truth."""
        return clip_from_trajectory(self.scene, self.trajectory, num_frames, height, width, self.manoeuvre,
                                    self.start_s, self.speed_kmh, self.camera_offsets)


def place(trajectory: EgoTrajectory, pose: np.ndarray) -> EgoTrajectory:
    """The trajectory moved rigidly so that its frame (origin, +x) lands on the world pose ``(x, y, yaw)``."""
    x, y, yaw = compose(pose, np.stack([trajectory.x, trajectory.y, trajectory.yaw], axis=-1)).T
    return EgoTrajectory(t=trajectory.t, x=x, y=y, yaw=yaw)


def clip_from_trajectory(scene: Scene, trajectory: EgoTrajectory, num_frames: int, height: int, width: int,
                         manoeuvre: str, start_s: float, speed_kmh: float,
                         camera_offsets: np.ndarray | None = None) -> Clip:
    """Render a world-frame trajectory's first ``num_frames`` frames at 10 Hz with their ground truth and routes;
    ``camera_offsets`` ``[>= num_frames, 3]`` moves each frame's camera off its pose; poses, actions and routes stay the
    car's."""
    poses = trajectory.poses_at(trajectory.t[0] + np.arange(num_frames) / FRAME_RATE_HZ)
    trajs = trajectory.instruction_trajs(num_frames)
    offsets = None if camera_offsets is None else np.asarray(camera_offsets)[:num_frames]
    cameras = poses if offsets is None else compose(poses, offsets)
    frames = np.stack([render(scene, p, height, width) for p in cameras])
    return Clip(frames=frames, poses=poses, instruction_trajs=trajs, actions=actions_from_instruction_trajs(trajs),
                manoeuvre=manoeuvre, seed=scene.seed, start_s=float(start_s), speed_kmh=float(speed_kmh),
                scene_length_m=scene.length_m, domain=scene.domain, routes=scene.route(poses, DATASET_ROUTE_POINTS),
                off_pose_frames=0 if offsets is None else int(np.cumprod(offsets.any(-1)).sum()))


def make_clip(scene: Scene, manoeuvre: str, num_frames: int, height: int, width: int, speed_kmh: float = 30.0,
              start_s: float = 0.0, lateral_m: float | None = None, **manoeuvre_params: float) -> Clip:
    """A clip of ``manoeuvre`` from arc length ``start_s``, ``lateral_m`` left of the road's centre (None: ego lane)."""
    world = manoeuvre_in_scene(scene, manoeuvre, num_frames, speed_kmh, start_s, lateral_m, **manoeuvre_params)
    return clip_from_trajectory(scene, world, num_frames, height, width, manoeuvre, start_s, speed_kmh)


def manoeuvre_in_scene(scene: Scene, manoeuvre: str, num_frames: int, speed_kmh: float = 30.0, start_s: float = 0.0,
                       lateral_m: float | None = None, **manoeuvre_params: float) -> EgoTrajectory:
    """The world-frame trajectory of :func:`make_clip`, long enough for ``num_frames`` frames and their actions."""
    if num_frames < 1:
        raise TerraInputError(f"a clip needs at least 1 frame (got num_frames={num_frames})")
    duration = (num_frames - 1) / FRAME_RATE_HZ + FUTURE_S
    if manoeuvre == FOLLOW_LANE:
        return _lane_keeping(scene, start_s, lateral_m, speed_kmh, 0.0, duration)
    local = manoeuvre_trajectory(manoeuvre, duration, speed_kmh=speed_kmh, rate_hz=SAMPLE_RATE_HZ, **manoeuvre_params)
    return place(local, scene.lane_pose(start_s, lateral_m))


def random_clip(rng: np.random.Generator, num_frames: int, height: int, width: int, domain: str = "day") -> Clip:
    return random_drive(rng, num_frames, domain).render(num_frames, height, width)


def random_drive(rng: np.random.Generator, num_frames: int, domain: str = "day") -> Drive:
    """A drive from the training distribution: random scene, start, speed (15-60 km/h) and manoeuvre; the same ``rng``
    gives the same drive in every ``domain``."""
    if num_frames < 1:
        raise TerraInputError(f"a clip needs at least 1 frame (got num_frames={num_frames})")
    scene = Scene.generate(int(rng.integers(2**31)), SCENE_LENGTH_M, domain)
    speed = float(rng.uniform(15.0, 60.0))
    duration = (num_frames - 1) / FRAME_RATE_HZ + FUTURE_S
    travel = (speed / 3.6 + 3.5 * duration) * duration
    start_s = float(rng.uniform(10.0, max(10.0, scene.length_m - travel - VIEW_MARGIN_M)))
    lateral = scene.ego_lane_offset_m + float(rng.uniform(-0.4, 0.4))
    kind = rng.random()
    if kind < 0.25:
        trajectory = _lane_keeping(scene, start_s, lateral, speed, float(rng.uniform(-1.5, 1.5)), duration)
        name = FOLLOW_LANE
    else:
        name = str(rng.choice(MANOEUVRES))
        params = random_manoeuvre_params(rng, name, speed)
        start = scene.lane_pose(start_s, lateral) + np.array([0.0, 0.0, rng.normal(0.0, 0.03)])
        local = manoeuvre_trajectory(name, duration, speed_kmh=speed, rate_hz=SAMPLE_RATE_HZ, **params)
        if kind < 0.5:
            lead = float(rng.uniform(0.5, 2.0))
            straight = manoeuvre_trajectory("straight", lead, speed_kmh=speed, rate_hz=SAMPLE_RATE_HZ)
            local = chain_trajectories(straight, local, duration)
            name = f"straight>{name}"
        trajectory = place(local, start)
    return Drive(scene, trajectory, name, start_s, speed)


def sample_frames(num: int, height: int, width: int, seed: int) -> np.ndarray:
    """``uint8 [num, H, W, 3]`` single frames from random scenes and poses (off-centre and yawed too)."""
    rng = np.random.default_rng([int(seed), 0xF4A3E5])
    frames = np.empty((num, height, width, 3), dtype=np.uint8)
    scene = None
    for i in range(num):
        if i % 8 == 0:  # a new scene every 8 frames
            scene = Scene.generate(int(rng.integers(2**31)), SCENE_LENGTH_M)
        s = rng.uniform(5.0, scene.length_m - VIEW_MARGIN_M)
        d = np.clip(rng.normal(EGO_LANE_OFFSET_M, 1.2), -2.5 * LANE_WIDTH_M, 2.5 * LANE_WIDTH_M)
        yaw = rng.normal(0.0, 0.08) if rng.random() < 0.7 else rng.uniform(-0.6, 0.6)
        frames[i] = render(scene, scene.lane_pose(s, d) + np.array([0.0, 0.0, yaw]), height, width)
    return frames


def random_manoeuvre_params(rng: np.random.Generator, name: str, speed_kmh: float) -> dict[str, float]:
    """Manoeuvre parameters that look plausible at ``speed_kmh`` and change the view clearly."""
    v = speed_kmh / 3.6
    if name.startswith("curve"):
        tightest = max(12.0, v * v / 6.0)  # lateral acceleration at most ~6 m/s^2
        return {"radius_m": float(rng.uniform(tightest, 2.5 * tightest + 20.0))}
    if name in ("accelerate", "decelerate", "stop"):
        return {"accel_mps2": float(rng.uniform(1.0, 4.0))}
    if name.startswith("lane_change"):
        return {"change_s": float(rng.uniform(1.5, 4.0)), "lane_width_m": LANE_WIDTH_M}
    return {}


def chain_trajectories(first: EgoTrajectory, second: EgoTrajectory, duration: float) -> EgoTrajectory:
    """``first`` followed by ``second`` started from ``first``'s final pose, cut to ``duration`` seconds."""
    moved = place(second, np.array([first.x[-1], first.y[-1], first.yaw[-1]]))
    keep = moved.t[1:] + first.t[-1] <= duration + 1e-9
    return EgoTrajectory(t=np.concatenate([first.t, moved.t[1:][keep] + first.t[-1]]),
                         x=np.concatenate([first.x, moved.x[1:][keep]]), y=np.concatenate([first.y, moved.y[1:][keep]]),
                         yaw=np.concatenate([first.yaw, moved.yaw[1:][keep]]))


def _lane_keeping(scene: Scene, start_s: float, lateral: float | None, speed_kmh: float, accel: float,
                  duration: float) -> EgoTrajectory:
    """Drive along the lane at offset ``lateral`` (None: the ego lane's centre) following the road's bends, speed
    changing by ``accel``."""
    t = np.arange(int(np.ceil(duration * SAMPLE_RATE_HZ)) + 1) / SAMPLE_RATE_HZ
    speed = np.maximum(speed_kmh / 3.6 + accel * t, 1.0)
    s = start_s + np.concatenate([[0.0], np.cumsum(speed[1:] / SAMPLE_RATE_HZ)])
    # Speed is measured along the centreline; on a bend the lane's own speed differs by a few percent.
    poses = scene.lane_pose(s, lateral)
    return EgoTrajectory(t=t, x=poses[:, 0], y=poses[:, 1], yaw=np.unwrap(poses[:, 2]))


def render_frames(num: int, image_size: tuple[int, int], seed: int, workers: int = 1) -> np.ndarray:
    """``uint8 [num, H, W, 3]`` frames of the synthetic world in ``workers`` processes (the same frames for any)."""
    chunk = max(1, min(256, math.ceil(num / 32)))  # chunks seed their frames: their size must not follow ``workers``
    jobs = [(min(chunk, num - start), *image_size, seed * 100_000 + i) for i, start in enumerate(range(0, num, chunk))]
    if workers <= 1:
        return np.concatenate([sample_frames(*job) for job in jobs])
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return np.concatenate(list(pool.map(sample_frames, *zip(*jobs))))


def builtin_context(manoeuvre: str, num_frames: int, image_size: tuple[int, int], seed: int, params: dict):
    """Frames ``[N, 3, H, W]`` in [-1, 1] driving ``manoeuvre`` with their exact actions: a run's built-in context."""
    import torch  # the world itself is numpy; only this hand-over to a tokenizer needs torch

    clip = make_clip(Scene.generate(seed), manoeuvre, num_frames, image_size[0], image_size[1], **params)
    return torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1.0, clip.actions


def builtin_road(manoeuvre: str, num_frames: int, seed: int, params: dict) -> tuple[Scene, np.ndarray]:
    """The scene of :func:`builtin_context` and its frames' world poses ``[num_frames, 3]``."""
    scene = Scene.generate(seed)
    world = manoeuvre_in_scene(scene, manoeuvre, num_frames, **params)
    return scene, world.poses_at(world.t[0] + np.arange(num_frames) / FRAME_RATE_HZ)
