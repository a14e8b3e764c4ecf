"""How a plan becomes the car's motion: a :class:`Vehicle` per drive and its :class:`Tracker` (pure pursuit)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from terra.closedloop.car.path import TrackedPath
from terra.closedloop.car.vehicle import VehicleParams, VehicleState, integrate
from terra.closedloop.plans import Plan
from terra.contract.actions import ACTION_TIMES, FRAME_RATE_HZ, validate_actions
from terra.inputs.ego_motion import compose


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


DT_S = 1.0 / FRAME_RATE_HZ


class Vehicle(Protocol):
    """The ego car of one drive: its pose in the drive's frame, its speed, and how it follows a plan."""

    name: str

    @property
    def pose(self) -> np.ndarray:
        """``[x, y, yaw]`` in the drive's frame."""

    @property
    def speed(self) -> float:
        """m/s."""

    def step(self, plan: Plan, dt: float = DT_S) -> np.ndarray:
        """Follow ``plan`` for ``dt`` seconds; the new pose (the next frame's, in the drive's frame)."""

    def forecast(self, plan: Plan, times: np.ndarray) -> np.ndarray:
        """Poses ``[len(times), 3]`` at ``times`` (s, > 0) in the ego frame of now, if the car keeps to ``plan``."""


class BicycleVehicle:
    """A kinematic bicycle with a tracking controller, starting at ``speed`` (m/s) and ``steer`` (rad)."""

    name = "bicycle"

    def __init__(self, speed: float, steer: float = 0.0, params: VehicleParams = VehicleParams(),
                 gains: TrackingGains = TrackingGains()) -> None:
        self.params, self.gains = params, gains
        self.state = VehicleState(speed=float(speed), steer=float(steer))
        self._ahead: tuple[Plan | Actuation, VehicleState] | None = None  # the last forecast's plan, its state at DT_S

    @property
    def pose(self) -> np.ndarray:
        return np.array([self.state.x, self.state.y, self.state.yaw])

    @property
    def speed(self) -> float:
        return self.state.speed

    def _simulate(self, plan: Plan | Actuation, times: np.ndarray) -> list[VehicleState]:
        """The states at ``times`` (ascending) in the plan's frame (the car's now)."""
        tracker = plan if isinstance(plan, Actuation) else Tracker(TrackedPath.from_plan(plan), self.params, self.gains)
        state = replace(self.state, x=0.0, y=0.0, yaw=0.0)
        period, now, k, out = self.gains.period_s, 0.0, 0, []
        for stop in times:
            while now < stop - 1e-9:
                if now >= k * period - 1e-9:  # a control instant: a new command
                    command = tracker.command(state, k * period)
                    k += 1
                until = min(float(stop), k * period)
                state = integrate(state, *command, until - now, self.params)
                now = until
            out.append(state)
        return out

    def forecast(self, plan: Plan | Actuation, times: np.ndarray) -> np.ndarray:
        """As :meth:`Vehicle.forecast`."""
        times = np.r_[DT_S, np.asarray(times, dtype=np.float64)]  # the next frame's time first
        order = np.argsort(times, kind="stable")
        states = self._simulate(plan, times[order])
        self._ahead = (plan, states[int(np.flatnonzero(order == 0)[0])])
        poses = np.empty((len(times), 3))
        poses[order] = [(s.x, s.y, s.yaw) for s in states]
        return poses[1:]

    def step(self, plan: Plan | Actuation, dt: float = DT_S) -> np.ndarray:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is plan and dt == DT_S:
            end = ahead[1]
        else:
            [end] = self._simulate(plan, np.array([dt]))
        x, y, yaw = compose(self.pose, np.array([end.x, end.y, end.yaw]))
        self.state = replace(end, x=float(x), y=float(y), yaw=float(yaw))
        return self.pose


class ExactVehicle:
    """The car where the plan puts it (``FakeLoop``'s rule), starting at ``speed`` (m/s) at the drive frame's origin."""

    name = "exact"

    def __init__(self, speed: float) -> None:
        self._pose, self._speed = np.zeros(3), float(speed)

    @property
    def pose(self) -> np.ndarray:
        return self._pose.copy()

    @property
    def speed(self) -> float:
        return self._speed

    def forecast(self, plan: Plan, times: np.ndarray) -> np.ndarray:
        path = TrackedPath.from_plan(plan)
        return np.stack([path.pose_at(float(t)) for t in np.asarray(times, dtype=np.float64)])

    def step(self, plan: Plan, dt: float = DT_S) -> np.ndarray:
        path = TrackedPath.from_plan(plan)
        self._speed = path.progress(dt)[1]
        self._pose = compose(self._pose, path.pose_at(dt))
        return self.pose


VEHICLES = {"bicycle": BicycleVehicle, "exact": ExactVehicle}  # the loop's ``vehicle`` setting: its class by name


def action_of(poses: np.ndarray) -> np.ndarray:
    """The world model's ``[6, 3]`` action ``[y, x, time]`` from ego-frame poses ``[6, 2|3]`` at the action times."""
    return validate_actions(np.stack([poses[:, 1], poses[:, 0], ACTION_TIMES], axis=-1)[None], "plan")[0]
