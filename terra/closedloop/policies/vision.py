"""Camera-only drivers: a detector finds the lane centre ahead, a steering law turns it into an arc."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from terra.closedloop.plans import Observation, Plan
from terra.closedloop.car.vehicle import VehicleParams
from terra.fidelity.lanes import LaneEstimate, channel_extremes, find_lane, ground_points, yellow_marking
from terra.inputs.ego_motion import along_arc
from terra.sim.scene import LANE_WIDTH_M

PLAN_DT_S, PLAN_STEPS = 0.1, 40
MAX_CURVATURE = 0.08  # 1/m: the drivers plan no tighter arc (12.5 m radius)
GREY_SPREAD = 40  # a paved pixel's channels differ by less (asphalt, the white line; grass and gravel are coloured)
ROAD_BAND_M = (4.0, 25.0)  # ground rows whose road edge is read (forward distance)


class LaneView(Protocol):
    """What a detector saw: the lane centre's lateral position ``ahead`` metres ahead (ego frame, left positive)."""

    def lateral(self, ahead: float) -> float: ...


Detector = Callable[[np.ndarray], "LaneView | None"]
SteeringLaw = Callable[[LaneView, float], float]


def arc_plan(curvature: float, speed_mps: float) -> Plan:
    """Poses along a circular arc of ``curvature`` (1/m, left positive) at ``speed_mps``, 10 Hz for 4 s."""
    x, y, heading = along_arc(curvature, speed_mps * PLAN_DT_S * np.arange(1, PLAN_STEPS + 1))
    return Plan.trajectory(np.stack([x, y, heading], axis=-1), dt=PLAN_DT_S)


def find_centre_line(frame: np.ndarray) -> LaneEstimate | None:
    """The ego lane's centre from the yellow centre line alone (:func:`~terra.fidelity.lanes.find_lane`)."""
    return find_lane(frame, edge_line=False)


def find_road_edge(frame: np.ndarray, min_rows: int = 8) -> LaneEstimate | None:
    """The ego lane's centre from the paved road's right edge."""
    fwd, left, valid = ground_points(*frame.shape[:2])
    centre = frame.shape[1] // 2
    rows = np.flatnonzero(valid[:, centre] & (fwd[:, centre] > ROAD_BAND_M[0]) & (fwd[:, centre] < ROAD_BAND_M[1]))
    paved = _paved(frame[rows, centre:])  # only these rows right of the centre are read
    rows, rightward = rows[paved[:, 0]], ~paved[paved[:, 0]]
    edge = rightward[:, :-1] & rightward[:, 1:]
    cols = centre + np.argmax(edge, axis=1)
    seen = edge.any(axis=1) & valid[rows, cols]  # an edge past the ground's reach has no position there
    if seen.sum() < min_rows:
        return None
    rows, cols = rows[seen], cols[seen]
    ahead, lane_centre = fwd[rows, cols], left[rows, cols] + LANE_WIDTH_M / 2
    keep = np.abs(lane_centre - np.median(lane_centre)) < 1.5  # a pole, a car or a shadow at the edge: outliers
    if keep.sum() < min_rows:
        return None
    slope, offset = np.polyfit(ahead[keep], lane_centre[keep], 1)
    return LaneEstimate(float(offset), float(slope), int(keep.sum()))


def _paved(frame: np.ndarray) -> np.ndarray:
    """Which pixels of ``frame`` (uint8 ``[..., 3]``) are paved: grey asphalt, the white line or the yellow one."""
    rgb = frame.astype(np.float32)
    brightest, darkest = channel_extremes(rgb)
    return (brightest - darkest < GREY_SPREAD) | yellow_marking(rgb)


@dataclass(frozen=True)
class PurePursuit:
    """The arc through the lane centre ``max(min_lookahead_m, lookahead_s * speed)`` ahead."""

    lookahead_s: float = 1.2
    min_lookahead_m: float = 8.0

    def __call__(self, lane: LaneView, speed_mps: float) -> float:
        ahead = max(self.min_lookahead_m, self.lookahead_s * max(speed_mps, 1.0))
        lateral = lane.lateral(ahead)
        return 2.0 * lateral / (ahead**2 + lateral**2)


@dataclass(frozen=True)
class Stanley:
    """Stanley's law (Thrun et al. 2006, the DARPA Grand Challenge's Stanley)."""

    gain: float = 1.0
    wheelbase_m: float = VehicleParams().wheelbase_m

    def __call__(self, lane: LaneView, speed_mps: float) -> float:
        cross = lane.lateral(self.wheelbase_m)
        heading = np.arctan(lane.lateral(self.wheelbase_m + 1.0) - cross)
        steer = heading + np.arctan(self.gain * cross / max(speed_mps, 1.0))
        return float(np.tan(np.clip(steer, -1.2, 1.2)) / self.wheelbase_m)


@dataclass(frozen=True)
class BangBang:
    """A fixed ``curvature`` towards the side where the lane centre lies ``lookahead_m`` ahead: it weaves."""

    curvature: float = 0.05
    lookahead_m: float = 6.0

    def __call__(self, lane: LaneView, speed_mps: float) -> float:
        return float(np.sign(lane.lateral(self.lookahead_m))) * self.curvature


class LaneFollower:
    """Keeps its lane from the newest camera frame alone (no route, no map)."""

    gil_bound = True

    def __init__(self, cruise_speed_mps: float = 8.0, detect: Detector = find_lane,
                 steer: SteeringLaw = PurePursuit(), accel_mps2: float = 1.5, name: str = "lane_follower") -> None:
        self.name, self.cruise_speed_mps, self.accel_mps2 = name, cruise_speed_mps, accel_mps2
        self.detect, self.steer = detect, steer
        self.curvature = 0.0

    def reset(self, scenario) -> None:
        self.curvature = 0.0

    def plan(self, observation: Observation) -> Plan:
        speed = observation.ego.speed_mps
        target = float(np.clip(self.cruise_speed_mps, speed - self.accel_mps2 * PLAN_DT_S,
                               speed + self.accel_mps2 * PLAN_DT_S))
        lane = self.detect(observation.frame)
        if lane is not None:
            self.curvature = float(np.clip(self.steer(lane, target), -MAX_CURVATURE, MAX_CURVATURE))
        return arc_plan(self.curvature, target)

    def close(self) -> None:
        pass
