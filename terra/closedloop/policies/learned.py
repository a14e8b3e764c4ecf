"""A learned driver: a small CNN reads the lane centre ahead from one frame, pure pursuit follows it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from terra.closedloop.scenarios import SCENE_LENGTH_M
from terra.config.assets import LEARNED_DRIVER
from terra.core.atomic import atomic_path
from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import to_ego
from terra.sim.renderer import render
from terra.sim.scene import Scene


PATH_AHEAD_M = (0.0, 5.0, 10.0, 15.0, 20.0)  # where the net reads the lane centre's lateral position
INPUT_SIZE = (24, 64)  # the net's input rows and columns
SKY_SHARE = 1 / 3  # the frame's top share left out (sky and horizon: the camera's horizon lies 41 % down)
RETRAIN = "retrain it with scripts/experiments/train_learned_policy.py"


class PathNet(nn.Module):
    """Three strided convolutions and two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 48, 3, stride=2, padding=1), nn.ReLU(),
        )
        rows, cols = (-(-n // 8) for n in INPUT_SIZE)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(48 * rows * cols, 64), nn.ReLU(),
                                  nn.Linear(64, len(PATH_AHEAD_M)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def net_input(frames: np.ndarray) -> torch.Tensor:
    """The net's input ``[N, 3, 24, 64]`` from uint8 frames ``[N, H, W, 3]`` of any size."""
    frames = np.asarray(frames)
    below = frames[:, int(frames.shape[1] * SKY_SHARE):]
    x = torch.from_numpy(np.array(below)).permute(0, 3, 1, 2).float()  # a copy: frames are handed read-only
    return nn.functional.interpolate(x, size=INPUT_SIZE, mode="area") / 127.5 - 1.0


def check_tensors(tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise one line unless ``tensors`` are exactly :class:`PathNet`'s, each float32, finite and of its shape."""
    expected = {name: tuple(t.shape) for name, t in PathNet().state_dict().items()}
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise TerraInputError(f"{where} is not the learned driver's weights (missing {missing or 'none'}, "
                              f"unexpected {extra or 'none'}); {RETRAIN}")
    for name, shape in expected.items():
        tensor = tensors[name]
        if tensor.dtype != torch.float32 or tuple(tensor.shape) != shape:
            raise TerraInputError(f"{where}: tensor {name} is {tensor.dtype} {list(tensor.shape)}, the learned "
                                  f"driver needs float32 {list(shape)}; {RETRAIN}")
        if not torch.isfinite(tensor).all():
            raise TerraInputError(f"{where}: tensor {name} holds NaN or infinite values; {RETRAIN}")


def load_path_net(path: Path | None = None) -> PathNet:
    """The learned driver's net from a safetensors file (None: the shipped one), checked; cached per path."""
    return _load_path_net(Path(LEARNED_DRIVER if path is None else path))


@lru_cache(maxsize=4)
def _load_path_net(path: Path) -> PathNet:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise TerraInputError(f"the learned driver's weights {path} do not exist; {RETRAIN}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise TerraInputError(f"the learned driver's weights {path} do not read as safetensors ({err}); "
                              f"{RETRAIN}") from None
    check_tensors(tensors, f"the learned driver's weights {path}")
    net = PathNet()
    net.load_state_dict(tensors)
    return net.eval().requires_grad_(False)


@dataclass(frozen=True)
class PathEstimate:
    """The lane centre's lateral positions ``laterals`` at ``ahead`` metres, read between them (clamped beyond)."""

    ahead: np.ndarray
    laterals: np.ndarray

    def lateral(self, ahead: float) -> float:
        return float(np.interp(ahead, self.ahead, self.laterals))


class LearnedLane:
    """A detector for :class:`~terra.closedloop.policies.vision.LaneFollower`."""

    def __init__(self, weights: Path | None = None) -> None:
        self.net = load_path_net(weights)

    def __call__(self, frame: np.ndarray) -> PathEstimate:
        with torch.inference_mode():
            laterals = self.net(net_input(frame[None]))[0].numpy().astype(np.float64)
        return PathEstimate(np.array(PATH_AHEAD_M), laterals)


OFFSET_M = 1.5  # the largest distance from the lane's centre a sample is drawn at
HEADING_RAD = 0.25  # the largest heading error a sample is drawn at
POSES_PER_SCENE = 25


@dataclass(frozen=True)
class Samples:
    """Net inputs ``[N, 3, 24, 64]`` and the expert's labels ``[N, len(PATH_AHEAD_M)]`` (metres)."""

    inputs: torch.Tensor
    labels: torch.Tensor


def expert_path(scene: Scene, pose: np.ndarray) -> np.ndarray:
    """The ego lane centre's lateral position at :data:`PATH_AHEAD_M` in the ego frame of world ``pose``."""
    s, _ = scene.road_coords(np.array([pose[0]]), np.array([pose[1]]))
    centre = to_ego(scene.lane_pose(s[0] + np.arange(-4.0, max(PATH_AHEAD_M) + 8.0, 0.5))[:, :2], pose)
    return np.interp(PATH_AHEAD_M, centre[:, 0], centre[:, 1])


def draw_samples(count: int, seed: int, image_size: Sequence[int]) -> Samples:
    """``count`` rendered, labelled poses of scenes drawn with ``seed`` (:data:`POSES_PER_SCENE` per scene)."""
    rng = np.random.default_rng([int(seed), 0xB1C0])
    frames, labels = [], []
    while len(frames) < count:
        scene = Scene.generate(int(rng.integers(2**31)), SCENE_LENGTH_M)
        for _ in range(min(POSES_PER_SCENE, count - len(frames))):
            s = rng.uniform(10.0, SCENE_LENGTH_M - max(PATH_AHEAD_M) - 20.0)
            pose = scene.lane_pose(s, scene.ego_lane_offset_m + rng.uniform(-OFFSET_M, OFFSET_M))
            pose[2] += rng.uniform(-HEADING_RAD, HEADING_RAD)
            frames.append(net_input(render(scene, pose, *image_size)[None])[0])
            labels.append(expert_path(scene, pose))
    return Samples(torch.stack(frames), torch.from_numpy(np.stack(labels)).float())


def _jitter(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each frame's brightness scaled by up to 20 % and each channel shifted by up to 0.1 (of [-1, 1])."""
    n = len(x)
    gain = 1.0 + 0.4 * (torch.rand(n, 1, 1, 1, generator=generator) - 0.5)
    shift = 0.2 * (torch.rand(n, 3, 1, 1, generator=generator) - 0.5)
    return ((x + 1.0) * gain - 1.0 + shift).clamp(-1.0, 1.0)


def train(samples: Samples, epochs: int = 30, batch_size: int = 64, lr: float = 2e-3, seed: int = 0) -> PathNet:
    """A :class:`PathNet` fitted to ``samples`` (Adam, Huber loss, the rate decayed to 0 by a cosine)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    net = PathNet()
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    steps = epochs * -(-len(samples.inputs) // batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(samples.inputs), generator=generator)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            loss = torch.nn.functional.smooth_l1_loss(net(_jitter(samples.inputs[batch], generator)),
                                                      samples.labels[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
    return net.eval().requires_grad_(False)


def path_errors(net: PathNet, samples: Samples) -> dict[str, float]:
    """The net's mean absolute error (metres) against the expert at each of :data:`PATH_AHEAD_M`."""
    with torch.inference_mode():
        error = (net(samples.inputs) - samples.labels).abs().mean(0)
    return {f"{ahead:g}m": float(e) for ahead, e in zip(PATH_AHEAD_M, error)}


def save_net(net: PathNet, path: Path, metadata: dict[str, str]) -> None:
    """``net``'s tensors as safetensors at ``path``, with ``metadata``."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().contiguous() for name, t in net.state_dict().items()}
    check_tensors(tensors, "the trained net")
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
