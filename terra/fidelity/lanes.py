"""The ego lane seen in a camera frame: lane markings found by colour, projected onto the road, fitted as a line."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from terra.sim.camera import FrontCamera
from terra.sim.renderer import EDGE_INSET_M, LINE_WIDTH_M
from terra.sim.scene import LANE_WIDTH_M

CENTRE_LINE_LEFT_M = LANE_WIDTH_M / 2  # the yellow line lies this far left of the lane's centre
EDGE_LINE_RIGHT_M = LANE_WIDTH_M - EDGE_INSET_M - LINE_WIDTH_M / 2 - LANE_WIDTH_M / 2  # white edge line, to the right
NEAR_M, FAR_M = 3.0, 28.0  # ground band used
MIN_SPAN_M = 2.0  # markings seen over a shorter stretch give no direction


@lru_cache(maxsize=8)
def ground_points(height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pixel of the camera, where its ray meets the road: ``(forward, left, valid)`` arrays ``[H, W]`` (cached)."""
    rays = FrontCamera(height, width).rays()
    fwd, left = rays.fwd, rays.left
    valid = (fwd > NEAR_M) & (fwd < FAR_M) & (np.abs(left) < 8.0)
    arrays = np.where(valid, fwd, 0.0), np.where(valid, left, 0.0), valid
    for arr in arrays:
        arr.setflags(write=False)
    return arrays


@lru_cache(maxsize=8)
def ground_rows(height: int, width: int) -> slice:
    """The band of image rows holding every valid pixel of :func:`ground_points` (cached)."""
    rows = np.flatnonzero(ground_points(height, width)[2].any(axis=1))
    return slice(int(rows[0]), int(rows[-1]) + 1) if rows.size else slice(0, 0)


def channel_extremes(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The brightest and the darkest channel of each pixel of ``rgb [..., 3]``."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)


@dataclass(frozen=True)
class LaneEstimate:
    """The lane's centre ahead as ``left = offset + slope * forward`` (ego frame), from ``points`` marking pixels."""

    offset: float
    slope: float
    points: int

    def lateral(self, ahead: float) -> float:
        """The lane centre's lateral position ``ahead`` metres ahead (ego frame, left positive)."""
        return self.offset + self.slope * ahead


def yellow_marking(rgb: np.ndarray) -> np.ndarray:
    """Which pixels of float ``rgb [H, W, 3]`` have the yellow centre line's colour."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return (r > 140) & (g > 110) & (r - b > 100) & (g - b > 80)


def find_lane(frame: np.ndarray, min_points: int = 12, edge_line: bool = True) -> LaneEstimate | None:
    """The ego lane's centre line in uint8 ``frame [H, W, 3]``, or None when too few markings show."""
    band = ground_rows(*frame.shape[:2])
    rgb = frame[band].astype(np.float32)
    fwd, left, valid = (arr[band] for arr in ground_points(*frame.shape[:2]))
    brightest, darkest = channel_extremes(rgb)
    yellow = valid & yellow_marking(rgb)
    white = valid & (brightest > 175) & (brightest - darkest < 45) & (left < -0.3) & edge_line
    centre_fwd = np.r_[fwd[yellow], fwd[white]]
    centre_left = np.r_[left[yellow] - CENTRE_LINE_LEFT_M, left[white] + EDGE_LINE_RIGHT_M]
    if len(centre_fwd) < min_points:
        return None
    keep = np.abs(centre_left - np.median(centre_left)) < 1.5  # the other road edge, cars, signs: outliers
    if keep.sum() < min_points or np.ptp(centre_fwd[keep]) < MIN_SPAN_M:
        return None
    weights = 1.0 / np.maximum(centre_fwd[keep], 1.0)  # near pixels are sharper
    slope, offset = np.polyfit(centre_fwd[keep], centre_left[keep], 1, w=np.sqrt(weights))
    return LaneEstimate(float(offset), float(slope), int(keep.sum()))
