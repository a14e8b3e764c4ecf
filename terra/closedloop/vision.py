"""A camera-only lane follower: the lane found in the frame's pixels (terra/fidelity/lanes.py), steered by pure pursuit.

Classical vision, no learning: the car follows an arc through the lane centre's point a look-ahead distance away
(pure pursuit) at a cruise speed, planned at 10 Hz over 4 s.
"""

from __future__ import annotations

import numpy as np

from terra.closedloop.plans import Observation, Plan
from terra.fidelity.lanes import find_lane
from terra.inputs.ego_motion import along_arc

PLAN_DT_S, PLAN_STEPS = 0.1, 40


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
