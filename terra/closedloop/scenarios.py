"""Where a drive starts: context frames, the actions between them, the speed, and what is known of the world.

Three sources, one :class:`Scenario` each:

* :func:`synthetic_scenarios`: the synthetic world (terra/sim/) keeping its lane along the road's bends; the
  scene is known, so the drive has a route (the ego lane's centre ahead) and ground truth (terra/closedloop/truth.py);
* :func:`log_scenarios`: a folder of driving-log clips (README, "Fine-tuning on your own drives"): the first
  ``num_context`` 10 Hz frames, their actions from the recorded trajectory and the recorded path ahead as route;
* :func:`sample_scenarios`: a batch JSONL (terra/batch/), each sample's context frames and trajectory.

Poses are world poses ``(x, y, yaw)``; a drive's own poses start at the last context frame (terra/closedloop/loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from terra.core.errors import TerraInputError
from terra.generation.actions import FRAME_RATE_HZ
from terra.inputs.trajectory import EgoTrajectory
from terra.session.controls import speed_of
from terra.sim.clips import FUTURE_S, clip_from_trajectory
from terra.sim.scene import Scene

ROUTE_AHEAD_M = 60.0  # route points ahead of the car
ROUTE_STEP_M = 2.0
COMMAND_TURN_M = 2.0  # the route 20 m ahead this far to a side is a turn
SCENE_LENGTH_M = 600.0


@dataclass(frozen=True)
class Scenario:
    """A drive's start."""

    id: str
    images: np.ndarray  # uint8 [n, H, W, 3] context frames at the tokenizer's size, oldest first
    actions: np.ndarray  # [n - 1, 6, 3] the actions between them
    speed_kmh: float  # at the last context frame
    start_pose: np.ndarray  # world pose of the last context frame
    scene: Scene | None = None  # the synthetic world's scene: a route and ground truth
    path: np.ndarray | None = None  # [M, 2] a recorded world path ahead (driving logs), used as the route
    source: str = ""

    def route(self, pose: np.ndarray) -> np.ndarray:
        """The route ahead of world ``pose`` in its ego frame ``[M, 2]`` (empty when none is known)."""
        if self.scene is not None:
            s, _ = self.scene.road_coords(np.array([pose[0]]), np.array([pose[1]]))
            ahead = self.scene.lane_pose(s[0] + np.arange(0.0, ROUTE_AHEAD_M, ROUTE_STEP_M))[:, :2]
        elif self.path is not None and len(self.path) >= 2:
            nearest = int(np.argmin(np.hypot(*(self.path - pose[:2]).T)))
            ahead = self.path[nearest:]
        else:
            return np.zeros((0, 2))
        return to_ego(ahead, pose)


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


def command_of(route: np.ndarray) -> str:
    """NAVSIM's driving command from a route in the ego frame: where it is 20 m ahead."""
    if len(route) < 2:
        return "unknown"
    along = np.hypot(*np.diff(route, axis=0).T).cumsum()
    lateral = float(np.interp(20.0, np.r_[0.0, along], route[:, 1]))
    return "left" if lateral > COMMAND_TURN_M else "right" if lateral < -COMMAND_TURN_M else "straight"


def synthetic_scenarios(count: int, seed: int, image_size: Sequence[int], num_context: int = 3,
                        speed_kmh: tuple[float, float] = (20.0, 40.0), domain: str = "day") -> list[Scenario]:
    """``count`` scenarios of the synthetic world: a random scene, start and speed each, the context driven along
    the ego lane's centre (the same ``seed`` gives the same scenarios)."""
    rng = np.random.default_rng([int(seed), 0xD21E])
    out = []
    for i in range(count):
        scene = Scene.generate(int(rng.integers(2**31)), SCENE_LENGTH_M, domain)
        speed = float(rng.uniform(*speed_kmh))
        start_s = float(rng.uniform(10.0, 200.0))
        t = np.arange(0.0, (num_context - 1) / FRAME_RATE_HZ + FUTURE_S + 0.05, 0.01)
        poses = scene.lane_pose(start_s + speed / 3.6 * t)
        trajectory = EgoTrajectory(t=t, x=poses[:, 0], y=poses[:, 1], yaw=np.unwrap(poses[:, 2]))
        clip = clip_from_trajectory(scene, trajectory, num_context, int(image_size[0]), int(image_size[1]),
                                    "follow_lane", start_s, speed)
        out.append(Scenario(f"synthetic-{seed}-{i:03d}", clip.frames, clip.actions[: num_context - 1],
                            speed_of(clip.actions[-1]), clip.poses[-1], scene=scene,
                            source=f"synthetic scene {scene.seed} at s={start_s:.0f} m, {speed:.0f} km/h"))
    return out


def log_scenarios(logs: str | Path, image_size: Sequence[int], num_context: int = 3,
                  resize: str = "stretch") -> list[Scenario]:
    """A scenario per clip folder of a driving log (the first ``num_context`` frames at 10 Hz); a clip that breaks
    the folder's rules (terra/inputs/driving_logs.py) is one line."""
    from terra.inputs import driving_logs as logs_lib

    folder = Path(logs).expanduser()
    if not folder.is_dir():
        raise TerraInputError(f"scenarios: driving-log folder {folder} does not exist; give a folder of clip folders")
    out = []
    for clip_dir in logs_lib.clip_folders(folder):
        try:
            clip = logs_lib.open_clip(clip_dir)
            kept = logs_lib.Resampled()
            frames = []
            for read in logs_lib.clip_frames(clip, tuple(image_size), resize, FRAME_RATE_HZ, kept):
                frames.append(read())
                if len(frames) == num_context:
                    break
            if len(frames) < num_context:
                raise TerraInputError(f"has {len(frames)} frames at 10 Hz, fewer than num_context={num_context}")
            motion = logs_lib.read_motion(clip.trajectory)
            actions = logs_lib.clip_actions(motion, kept, clip.shared_clock)
        except TerraInputError as err:
            raise TerraInputError(f"scenarios: driving-log clip {clip_dir.name} {err}") from None
        path = start = None
        if isinstance(motion, EgoTrajectory):
            times = np.asarray(kept.times) - kept.times[0] + motion.t[0] if not clip.shared_clock else \
                np.asarray(kept.times)
            start = motion.poses_at(np.array([times[-1]]))[0]
            later = motion.t > times[-1]
            path = np.stack([motion.x[later], motion.y[later]], axis=-1)
        out.append(Scenario(f"log-{clip_dir.name}", np.stack(frames), actions[: num_context - 1],
                            speed_of(actions[-1]), np.zeros(3) if start is None else start, path=path,
                            source=f"driving log {clip_dir}"))
    if not out:
        raise TerraInputError(f"scenarios: driving-log folder {folder} holds no clip folders")
    return out


def sample_scenarios(samples: str | Path, image_size: Sequence[int], num_context: int = 3,
                     image_root: str | Path | None = None, resize: str = "crop") -> list[Scenario]:
    """A scenario per sample of a batch JSONL (terra/batch/__init__.py): its last ``num_context`` context frames
    and the actions between them; a malformed line is one line naming it."""
    from terra.batch.samples import read_samples
    from terra.inputs.context import load_context
    from terra.inputs.requests import TRAJECTORY_KEYS, trajectory_actions

    out = []
    for sample in read_samples(Path(samples).expanduser()):
        if sample.error is not None:
            raise TerraInputError(f"scenarios: {Path(samples).name} {sample.error}")
        record = sample.record
        root = Path(image_root).expanduser() if image_root else Path(sample.file).resolve().parent
        where = f"scenarios: sample {record['sample_id']!r}"
        items = record["context_frames"] if sample.kind == "actbench" else record["context"]
        images, _ = load_context(items, tuple(image_size), num_context, base=root, resize=resize)
        n = len(images)
        if sample.kind == "actbench":
            trajs = np.asarray(record["instruction_trajs"], dtype=np.float64)
            skip = len(items) - n
            actions = trajectory_actions({"instruction_trajs": trajs.tolist()}, n, 1, where, skip=skip)
        else:
            given = [k for k in TRAJECTORY_KEYS if k in record]
            if not given:
                raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)}")
            value = record[given[0]]
            trajectory = value if given[0] == "trajectory" and isinstance(value, str) else {given[0]: value}
            actions = trajectory_actions(trajectory, n, 1, where, base=Path(sample.file).resolve().parent)
        frames = ((images.permute(0, 2, 3, 1).numpy() + 1.0) * 127.5).round().clip(0, 255).astype(np.uint8)
        out.append(Scenario(f"sample-{record['sample_id']}", frames, actions[: n - 1], speed_of(actions[n - 1]),
                            np.zeros(3), source=f"{Path(samples).name} line {sample.line}"))
    return out
