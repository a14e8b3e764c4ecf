"""A learned driver: a small CNN reads the lane centre ahead from one frame, pure pursuit follows it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from terra.config.assets import LEARNED_DRIVER
from terra.core.errors import TerraInputError

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
