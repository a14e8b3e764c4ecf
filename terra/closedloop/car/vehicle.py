"""The ego car's body: a kinematic bicycle about the rear axle with actuator lags and limits."""

from __future__ import annotations

import math
from dataclasses import dataclass

EGO_LENGTH_M = 4.5  # the body's rectangle (truth judges it in the scene)
EGO_WIDTH_M = 1.8


@dataclass(frozen=True)
class VehicleParams:
    """A mid-size car."""

    wheelbase_m: float = 2.85  # AlpaSim's default vehicle
    max_steer_rad: float = 0.6  # 34 deg road-wheel lock (a 4.2 m turning radius at the rear axle), within
    # AlpaSim's MPC bound of pi/4 rad
    max_steer_rate: float = 0.4  # rad/s, CommonRoad's steering.v_max
    steer_lag_s: float = 0.1  # AlpaSim's steering_time_constant
    accel_lag_s: float = 0.1  # AlpaSim's acceleration_time_constant
    min_accel: float = -8.0  # m/s^2, AlpaSim's MPC acceleration state bounds [-8, 6]
    max_accel: float = 6.0
    max_speed: float = 35.0  # m/s (126 km/h), AlpaSim's MPC speed bound [0, 35]
    substep_s: float = 0.01  # AlpaSim's DT_STEP_MAX


@dataclass(frozen=True)
class VehicleState:
    """Where the car is and what its actuators do."""

    x: float = 0.0
    y: float = 0.0
    yaw: float = 0.0
    speed: float = 0.0
    steer: float = 0.0
    accel: float = 0.0


def _clip(value: float, low: float, high: float) -> float:
    return low if value < low else high if value > high else value


def integrate(state: VehicleState, steer_cmd: float, accel_cmd: float, duration: float,
              params: VehicleParams) -> VehicleState:
    """The state ``duration`` seconds later with the commands held (each clipped to the car's limits)."""
    p = params
    steer_cmd = _clip(steer_cmd, -p.max_steer_rad, p.max_steer_rad)
    accel_cmd = _clip(accel_cmd, p.min_accel, p.max_accel)
    steps = max(1, math.ceil(duration / p.substep_s - 1e-9))
    h = duration / steps
    top, base, lock = p.max_speed, p.wheelbase_m, p.max_steer_rad
    rate, steer_lag, accel_lag = p.max_steer_rate, p.steer_lag_s, p.accel_lag_s
    low_accel, high_accel = p.min_accel, p.max_accel
    cos, sin, tan = math.cos, math.sin, math.tan
    x, y, yaw, speed, steer, accel = state.x, state.y, state.yaw, state.speed, state.steer, state.accel
    for _ in range(steps):
        # k1, the rates at the sub-step's start (only those the midpoint needs)
        v = 0.0 if speed < 0.0 else top if speed > top else speed
        blocked = (v <= 0.0 and accel < 0.0) or (v >= top and accel > 0.0)
        yaw_rate1 = v * tan(steer) / base
        speed_rate1 = 0.0 if blocked else accel
        steer_rate1 = _clip((steer_cmd - steer) / steer_lag, -rate, rate)
        accel_rate1 = (accel_cmd - accel) / accel_lag
        # k2, at the midpoint
        speed2, yaw2 = speed + 0.5 * h * speed_rate1, yaw + 0.5 * h * yaw_rate1
        steer2, accel2 = steer + 0.5 * h * steer_rate1, accel + 0.5 * h * accel_rate1
        v = 0.0 if speed2 < 0.0 else top if speed2 > top else speed2
        blocked = (v <= 0.0 and accel2 < 0.0) or (v >= top and accel2 > 0.0)
        steer_rate2 = _clip((steer_cmd - steer2) / steer_lag, -rate, rate)
        x, y, yaw = x + h * (v * cos(yaw2)), y + h * (v * sin(yaw2)), yaw + h * (v * tan(steer2) / base)
        speed = _clip(speed + h * (0.0 if blocked else accel2), 0.0, top)
        steer = _clip(steer + h * steer_rate2, -lock, lock)
        accel = _clip(accel + h * ((accel_cmd - accel2) / accel_lag), low_accel, high_accel)
    return VehicleState(x, y, yaw, speed, steer, accel)
