"""The tracking controller between a plan and the car: pure pursuit on the plan's path, a speed loop on its timing.

Every ``period_s`` (AlpaSim's controller runs every 0.1 s and holds its command in between) it reads the whole plan
(terra/closedloop/car/path.py) from the car's state, in the plan's frame:

* **steering**: pure pursuit about the rear axle (Coulter, CMU-RI-TR-92-01): the point of the path ``lookahead``
  metres on from where the car is along it, ``lookahead = clip(lookahead_s * speed, min, max)``; the arc from the
  car through it has curvature ``2 y / d^2`` (``y`` its lateral offset, ``d`` its distance), and the steering is
  ``atan(wheelbase * curvature)``. An arc needs no heading, so a plan without one is followed as well.
* **acceleration**: the plan's own acceleration (feed-forward, read ``lag`` ahead so that it arrives through the
  actuator's lag), plus feedback on the speed and on the distance along the path against where the plan has the car
  at that time: ``a = a_plan(t + lag) + speed_gain (v_plan - v) + position_gain (s_plan - s)``. Where the plan has
  come to rest (slower than ``hold_speed``, less than ``hold_m`` short of its end) the car brakes at ``hold_accel``
  at least, so that it comes to rest too instead of creeping.

:class:`Actuation` is the other controller: steering and acceleration given directly and held (the gymnasium env's
``actuation`` actions, terra/closedloop/gym/spaces.py), the car's limits and lags applied by the vehicle.

The gains are this module's own. The speed loop is critically damped at 1 rad/s (``position_gain = 1``,
``speed_gain = 2``), slow beside the 0.1 s lag. The look-ahead came from a sweep (0.3 to 1 s, at least 2 to 5 m) over
tests/closedloop/car/test_vehicle.py's plans: with 0.6 s and 4 m a 3.5 m lane change in 3 s is followed within 10 cm at
5 to 30 m/s, a car starting 0.5 m beside a straight plan overshoots it by under 4 cm at 3 to 30 m/s, and a circle
is tracked exactly once the steering has settled; 0.45 s or a 3 m minimum overshoot by up to 23 cm at 5 to 8 m/s,
a 2 m minimum loses the plan at 3 m/s (5 m off after 10 s, the steering-rate limit lagging it), and 0.8 s cuts
the lane change by 15 cm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from terra.closedloop.car.path import TrackedPath
from terra.closedloop.car.vehicle import VehicleParams, VehicleState


@dataclass(frozen=True)
class TrackingGains:
    """The controller's settings (see the module docstring for where they come from)."""

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
    """Follows one plan: :meth:`command` gives the steering and acceleration for the car's state at time ``t``
    (seconds after the plan was made, the state in the plan's frame)."""

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
    """Steering (rad, road wheels, left positive) and acceleration (m/s^2) commands held until the next ones: what
    :meth:`command` gives whatever the car's state (the vehicle clips them to its limits:
    terra/closedloop/car/vehicle.py)."""

    steer: float
    accel: float

    def command(self, state: VehicleState, t: float) -> tuple[float, float]:
        return self.steer, self.accel
