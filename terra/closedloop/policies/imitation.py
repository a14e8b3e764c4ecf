"""Behaviour cloning of the learned driver on the true world's frames."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from terra.closedloop.policies.learned import PATH_AHEAD_M, PathNet, check_tensors, net_input
from terra.closedloop.scenarios import SCENE_LENGTH_M
from terra.core.atomic import atomic_path
from terra.inputs.ego_motion import to_ego
from terra.sim.renderer import render
from terra.sim.scene import Scene

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
