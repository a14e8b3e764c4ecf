"""The tracking controller: pure pursuit on the plan's path, a speed loop on its timing."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from terra.closedloop.car.path import TrackedPath
from terra.closedloop.car.vehicle import VehicleParams, VehicleState


@dataclass(frozen=True)
class TrackingGains:
    """The controller's settings."""

    period_s: float = 0.1  # a command every 0.1 s, held in between (AlpaSim's dt_mpc)
    lookahead_s: float = 0.6  # look-ahead distance per m/s of speed
    lookahead_min_m: float = 4.0
    lookahead_max_m: float = 25.0
    speed_gain: float = 2.0  # 1/s
    position_gain: float = 1.0  # 1/s^2
    hold_speed: float = 0.1  # m/s: a plan this slow, the car less than hold_m short of its end,
    hold_m: float = 0.1  # holds the car with the brakes
    hold_accel: float = -1.0  # m/s^2


@dataclass
class Tracker:
    """Follows one plan."""

    path: TrackedPath
    params: VehicleParams
    gains: TrackingGains
    segment: int = 0  # the path's segment the car was last found on (it moves forward along the path)

    def command(self, state: VehicleState, t: float) -> tuple[float, float]:
        """``(steering, acceleration)`` commands for ``state`` at time ``t``."""
        g, p = self.gains, self.params
        reach = 2.0 * p.max_speed * g.period_s  # twice what the car can drive in a period
        s, self.segment = self.path.project(np.array([state.x, state.y]), self.segment, reach)
        lookahead = min(max(g.lookahead_s * state.speed, g.lookahead_min_m), g.lookahead_max_m)
        tx, ty = self.path.point_at(s + lookahead)
        dx, dy = tx - state.x, ty - state.y
        c, si = math.cos(state.yaw), math.sin(state.yaw)
        ahead, left = c * dx + si * dy, -si * dx + c * dy
        curvature = 2.0 * left / max(ahead * ahead + left * left, 1e-9)
        steer = math.atan(p.wheelbase_m * curvature)
        s_plan, v_plan, _ = self.path.progress(t)
        _, _, a_plan = self.path.progress(t + p.accel_lag_s)
        accel = a_plan + g.speed_gain * (v_plan - state.speed) + g.position_gain * (s_plan - s)
        if v_plan < g.hold_speed and self.path.length_m - s < g.hold_m:
            accel = min(accel, g.hold_accel)
        return steer, accel


@dataclass(frozen=True)
class Actuation:
    """Steering (rad, road wheels, left positive) and acceleration (m/s^2) commands held until the next ones."""

    steer: float
    accel: float

    def command(self, state: VehicleState, t: float) -> tuple[float, float]:
        return self.steer, self.accel
