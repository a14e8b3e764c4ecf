"""A camera-only lane follower: lane markings found in the frame's pixels, steered by pure pursuit.

Classical vision, no learning: pixels of the ground near the car are classified by colour as the yellow
dashed centre line or the white edge line (the markings of terra/sim/renderer.py), projected onto the road plane
through the front camera (terra/sim/camera.py: a pinhole of known field of view, height and pitch), and each marking's
points, shifted by its known distance from the lane's centre, vote for that centre's lateral position as a
line ahead (least squares). The car then follows an arc through the centre point a look-ahead distance away
(pure pursuit) at a cruise speed, planned at 10 Hz over 4 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from terra.closedloop.plans import Observation, Plan
from terra.inputs.ego_motion import along_arc
from terra.sim.camera import FrontCamera
from terra.sim.renderer import EDGE_INSET_M, LINE_WIDTH_M
from terra.sim.scene import LANE_WIDTH_M

CENTRE_LINE_LEFT_M = LANE_WIDTH_M / 2  # the yellow line lies this far left of the lane's centre
EDGE_LINE_RIGHT_M = LANE_WIDTH_M - EDGE_INSET_M - LINE_WIDTH_M / 2 - LANE_WIDTH_M / 2  # white edge line, to the right
NEAR_M, FAR_M = 3.0, 28.0  # ground band used
PLAN_DT_S, PLAN_STEPS = 0.1, 40


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


@dataclass(frozen=True)
class LaneEstimate:
    """The lane's centre ahead as ``left = offset + slope * forward`` (ego frame), from ``points`` marking pixels."""

    offset: float
    slope: float
    points: int


def find_lane(frame: np.ndarray, min_points: int = 12) -> LaneEstimate | None:
    """The ego lane's centre line seen in ``frame`` (uint8 ``[H, W, 3]``), or None when too few markings show."""
    rgb = frame.astype(np.float32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    fwd, left, valid = ground_points(*frame.shape[:2])
    brightest = rgb.max(-1)
    yellow = valid & (r > 140) & (g > 110) & (r - b > 100) & (g - b > 80)  # not the gravel shoulder
    white = valid & (brightest > 175) & (brightest - rgb.min(-1) < 45) & (left < -0.3)
    centre_fwd = np.r_[fwd[yellow], fwd[white]]
    centre_left = np.r_[left[yellow] - CENTRE_LINE_LEFT_M, left[white] + EDGE_LINE_RIGHT_M]
    if len(centre_fwd) < min_points:
        return None
    keep = np.abs(centre_left - np.median(centre_left)) < 1.5  # the other road edge, cars, signs: outliers
    if keep.sum() < min_points:
        return None
    weights = 1.0 / np.maximum(centre_fwd[keep], 1.0)  # near pixels are sharper
    slope, offset = np.polyfit(centre_fwd[keep], centre_left[keep], 1, w=np.sqrt(weights))
    return LaneEstimate(float(offset), float(slope), int(keep.sum()))


def arc_plan(curvature: float, speed_mps: float, steps: int = PLAN_STEPS, dt: float = PLAN_DT_S) -> Plan:
    """Poses along a circular arc of ``curvature`` (1/m, left positive) at ``speed_mps``, 10 Hz for 4 s."""
    x, y, heading = along_arc(curvature, speed_mps * dt * np.arange(1, steps + 1))
    return Plan.trajectory(np.stack([x, y, heading], axis=-1), dt=dt)


class LaneFollower:
    """Keeps its lane from the newest camera frame alone (no route, no map): :func:`find_lane` + pure pursuit.

    ``cruise_speed_mps`` is the speed it settles at (``accel_mps2`` per second towards it); ``lookahead_s`` sets
    the pursuit distance (at least ``min_lookahead_m``); with no markings in view it keeps its last curvature.
    """

    def __init__(self, cruise_speed_mps: float = 8.0, lookahead_s: float = 1.2, min_lookahead_m: float = 8.0,
                 accel_mps2: float = 1.5, name: str = "lane_follower") -> None:
        self.name = name
        self.cruise_speed_mps = cruise_speed_mps
        self.lookahead_s = lookahead_s
        self.min_lookahead_m = min_lookahead_m
        self.accel_mps2 = accel_mps2
        self.curvature = 0.0

    def reset(self, scenario) -> None:
        self.curvature = 0.0

    def plan(self, observation: Observation) -> Plan:
        speed = observation.ego.speed_mps
        target = float(np.clip(self.cruise_speed_mps, speed - self.accel_mps2 * PLAN_DT_S,
                               speed + self.accel_mps2 * PLAN_DT_S))
        lane = find_lane(observation.frame)
        if lane is not None:
            ahead = max(self.min_lookahead_m, self.lookahead_s * max(target, 1.0))
            lateral = lane.offset + lane.slope * ahead
            self.curvature = float(np.clip(2.0 * lateral / (ahead**2 + lateral**2), -0.08, 0.08))
        return arc_plan(self.curvature, target)

    def close(self) -> None:
        pass
