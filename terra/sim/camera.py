"""The synthetic world's front camera: a pinhole at any image size.

Ego frame: x forward, y left, z up; image: u right, v down, pixel centres at +0.5."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

CAMERA_HEIGHT_M = 1.6
CAMERA_PITCH_RAD = np.deg2rad(4.0)  # downwards
CAMERA_HFOV_RAD = np.deg2rad(70.0)
_C, _S = np.cos(CAMERA_PITCH_RAD), np.sin(CAMERA_PITCH_RAD)
OPTICAL_AXES = np.array([[0.0, -_S, _C], [-1.0, 0.0, 0.0], [0.0, -_C, -_S]])  # right, down, forward in the ego frame


class GroundRays(NamedTuple):
    """The rays of an image's pixel rows ``first_row`` on, and where they meet the ground."""

    across: np.ndarray  # [W] a column's ray, rightwards per unit of optical depth
    drop: np.ndarray  # [rows] the ray's downward component in the world (optical axis normalised to 1)
    depth: np.ndarray  # [rows] optical depth of its ground hit; inf where it misses the ground
    fwd: np.ndarray  # [rows, W] the hit point ahead of the camera (m, ego frame); 0 where no hit is near
    left: np.ndarray  # [rows, W] the hit point to the left (m, ego frame); 0 where no hit is near


@dataclass(frozen=True)
class FrontCamera:
    """The front camera at an image size: its pinhole and its pixels' rays."""

    height: int
    width: int

    @property
    def focal(self) -> float:
        """Focal length in pixels."""
        return self.width / 2 / np.tan(CAMERA_HFOV_RAD / 2)

    @property
    def cx(self) -> float:
        return self.width / 2

    @property
    def cy(self) -> float:
        return self.height / 2

    @property
    def horizon(self) -> float:
        """The image row of the horizon (fractional)."""
        return self.cy - self.focal * np.tan(CAMERA_PITCH_RAD)

    def intrinsics(self) -> np.ndarray:
        return np.array([[self.focal, 0.0, self.cx], [0.0, self.focal, self.cy], [0.0, 0.0, 1.0]])

    def project(self, fwd: np.ndarray, left: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Image coordinates (u, v) and optical depth of ego-frame points (up measured from the ground)."""
        z = up - CAMERA_HEIGHT_M
        depth = fwd * _C - z * _S
        safe = np.where(depth > 1e-6, depth, 1e-6)
        return self.cx - self.focal * left / safe, self.cy + self.focal * (-fwd * _S - z * _C) / safe, depth

    def rays(self, first_row: int = 0, far: float = np.inf) -> GroundRays:
        """Where the rays of rows ``first_row`` on meet the road plane; hits at depth ``far`` or more count as none."""
        across = (np.arange(self.width) + 0.5 - self.cx) / self.focal
        down = (np.arange(first_row, self.height) + 0.5 - self.cy) / self.focal
        drop = _S + down * _C
        with np.errstate(divide="ignore"):
            depth = np.where(drop > 1e-9, CAMERA_HEIGHT_M / drop, np.inf)
        near = depth < far
        fwd = np.where(near, depth * (_C - down * _S), 0.0)[:, None] * np.ones(self.width)
        left = -np.where(near, depth, 0.0)[:, None] * across[None, :]
        return GroundRays(across, drop, depth, fwd, left)
