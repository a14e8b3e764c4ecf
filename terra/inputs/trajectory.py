"""Ego trajectories in a world frame, and named manoeuvres that synthesise them."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from terra.config.checks import MAX_FRAMES, Range, shown
from terra.contract.actions import FRAME_RATE_HZ, FUTURE_POINTS, FUTURE_RATE_HZ, MAX_SPEED_MPS
from terra.core.errors import TerraInputError, past
from terra.inputs.ego_motion import to_ego

# Sane world-frame trajectories of a car, in metres and seconds; MAX_SPEED_MPS bounds the speed between samples.
MAX_COORDINATE_M = 1e7  # x, y (projected map coordinates included)
MAX_TIME_S = 1e10  # timestamps (Unix seconds included)
MAX_YAW_RAD = 1e4  # unwrapped yaw
RATE_HZ = Range(0.1, 1000, 10)  # samples per second of a trajectory given without timestamps


@dataclass(frozen=True)
class EgoTrajectory:
    """World-frame ego poses at increasing times."""

    t: np.ndarray  # [N] seconds, strictly increasing
    x: np.ndarray  # [N] metres
    y: np.ndarray  # [N] metres
    yaw: np.ndarray  # [N] radians, unwrapped

    @classmethod
    def from_arrays(cls, x: np.ndarray, y: np.ndarray, yaw: np.ndarray | None = None, t: np.ndarray | None = None,
                    rate_hz: float = FRAME_RATE_HZ, source: str = "trajectory") -> "EgoTrajectory":
        """Validate and build; ``yaw`` defaults to the direction of motion, ``t`` to samples at ``rate_hz``."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        n = len(x)
        if n < 2 or len(y) != n:
            raise TerraInputError(f"{source}: needs at least 2 points with as many x as y values "
                                  f"(got {n} x, {len(y)} y)")
        t = np.asarray(np.arange(n) / RATE_HZ.check(rate_hz, "rate_hz", f"{source}: ") if t is None else t,
                       dtype=np.float64).reshape(-1)
        if len(t) != n:
            raise TerraInputError(f"{source}: has {len(t)} timestamps for {n} points; give one timestamp per point")
        yaw = np.asarray(_heading_from_motion(x, y) if yaw is None else yaw, dtype=np.float64).reshape(-1)
        if len(yaw) != n:
            raise TerraInputError(f"{source}: has {len(yaw)} yaw values for {n} points; give one per point or none")
        for name, arr, limit, unit in (("t", t, MAX_TIME_S, "s"), ("x", x, MAX_COORDINATE_M, "m"),
                                       ("y", y, MAX_COORDINATE_M, "m"), ("yaw", yaw, MAX_YAW_RAD, "rad")):
            if not np.all(np.isfinite(arr)):
                raise TerraInputError(f"{source}: column {name} holds NaN or inf; replace them with finite values")
            if np.abs(arr).max() > limit:
                raise TerraInputError(f"{source}: column {name} holds {past(np.abs(arr).max(), limit)}, beyond "
                                      f"+-{limit:g} {unit}; give metres, seconds and radians")
        dt = np.diff(t)
        if np.any(dt <= 0):
            raise TerraInputError(f"{source}: timestamps must increase strictly; sort the points by time")
        speed = np.hypot(np.diff(x), np.diff(y)) / dt
        if speed.max() > MAX_SPEED_MPS:
            i = int(np.argmax(speed))
            raise TerraInputError(f"{source}: the car would move at {past(speed[i], MAX_SPEED_MPS)} m/s between points "
                                  f"{i} and {i + 1}, faster than {MAX_SPEED_MPS:g} m/s; give positions in metres and "
                                  "times in seconds")
        return cls(t=t, x=x, y=y, yaw=np.unwrap(yaw))

    @property
    def duration(self) -> float:
        return float(self.t[-1] - self.t[0])

    def num_frames(self, fps: float = FRAME_RATE_HZ) -> int:
        """Frames at ``fps`` that the trajectory spans, its first sample being frame 0."""
        return int(np.floor(self.duration * fps + 1e-6)) + 1

    def poses_at(self, times: np.ndarray) -> np.ndarray:
        """``[..., 3]`` poses (x, y, yaw) at absolute ``times``; extrapolated with the final speed and yaw rate."""
        times = np.asarray(times, dtype=np.float64)
        flat = times.reshape(-1)
        x, y, yaw = (np.interp(flat, self.t, values) for values in (self.x, self.y, self.yaw))
        late = flat > self.t[-1]
        if np.any(late):
            dt_last = self.t[-1] - self.t[-2]
            speed = np.hypot(self.x[-1] - self.x[-2], self.y[-1] - self.y[-2]) / dt_last
            rate = (self.yaw[-1] - self.yaw[-2]) / dt_last
            x[late], y[late], yaw[late] = _integrate_arc(self.x[-1], self.y[-1], self.yaw[-1], speed, rate,
                                                         flat[late] - self.t[-1])
        return np.stack([x, y, yaw], axis=-1).reshape(*times.shape, 3)

    def instruction_trajs(self, num_frames: int | None = None, fps: float = FRAME_RATE_HZ) -> np.ndarray:
        """Per-frame future trajectories ``[T, 60, 3]`` in each frame's ego frame (x fwd, y left, z=0)."""
        num_frames = self.num_frames(fps) if num_frames is None else num_frames
        if num_frames > MAX_FRAMES:
            raise TerraInputError(f"the trajectory spans {num_frames} frames at {fps:g} Hz, more than the "
                                  f"{MAX_FRAMES} a rollout may have; trim it")
        frame_t = self.t[0] + np.arange(num_frames) / fps
        future_t = frame_t[:, None] + np.arange(FUTURE_POINTS)[None, :] / FUTURE_RATE_HZ
        local = to_ego(self.poses_at(future_t)[..., :2], self.poses_at(frame_t)[:, None])  # [T, 60, 2]
        return np.concatenate([local, np.zeros_like(local[..., :1])], axis=-1).astype(np.float32)


def _heading_from_motion(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Yaw along the path; points where the car stands still keep the previous heading."""
    dx, dy = np.gradient(x), np.gradient(y)
    moving = np.hypot(dx, dy) > 1e-6
    yaw = np.zeros(len(x))
    if not np.any(moving):
        return yaw
    heading = np.arctan2(dy, dx)
    idx = np.where(moving, np.arange(len(x)), 0)
    np.maximum.accumulate(idx, out=idx)
    first = int(np.argmax(moving))
    idx[:first] = first
    return np.unwrap(heading[idx])


def _integrate_arc(x0: float, y0: float, yaw0: float, speed: float, rate: float, dt: np.ndarray):
    """Closed-form pose after moving ``dt`` at constant speed and yaw rate from ``(x0, y0, yaw0)``."""
    yaw = yaw0 + rate * dt
    if abs(rate) < 1e-9:
        return x0 + speed * dt * np.cos(yaw0), y0 + speed * dt * np.sin(yaw0), yaw
    radius = speed / rate
    return x0 + radius * (np.sin(yaw) - np.sin(yaw0)), y0 - radius * (np.cos(yaw) - np.cos(yaw0)), yaw


# ---------------------------------------------------------------------------------------------- manoeuvres

MANOEUVRES = ("straight", "curve_left", "curve_right", "accelerate", "decelerate", "stop", "lane_change_left",
              "lane_change_right")
# Keeping the ego lane along a synthetic scene's road: only where that road exists.
FOLLOW_LANE = "follow_lane"


# User-settable manoeuvre parameters and their sane ranges.
MANOEUVRE_RANGES = {
    "speed_kmh": Range(0, 250, 30),
    "radius_m": Range(2, 10_000, 30),
    "accel_mps2": Range(0, 15, 2),
    "lane_width_m": Range(0, 10, 3.5),
    "change_s": Range(0.5, 30, 3),
}
MANOEUVRE_PARAMS = tuple(MANOEUVRE_RANGES)
MAX_MANOEUVRE_S = MAX_FRAMES / FRAME_RATE_HZ + 10.0  # longest synthesised trajectory (rollout + lookahead)


def check_manoeuvre_params(params, source: str = "manoeuvre_params") -> dict[str, float]:
    """Manoeuvre parameters checked against :data:`MANOEUVRE_RANGES`, as floats."""
    if params is None:
        return {}
    if not hasattr(params, "items"):
        raise TerraInputError(f"{source} must be a mapping such as {{speed_kmh: 40, radius_m: 25}} (got {params!r})")
    checked = {}
    for key, value in params.items():
        if value is None:
            continue
        if key not in MANOEUVRE_PARAMS:
            raise TerraInputError(f"{source}: unknown manoeuvre parameter {key!r}; use {', '.join(MANOEUVRE_PARAMS)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TerraInputError(f"{source}: {key}={shown(value)} is not a number; e.g. {key}=30")
        named = source == "manoeuvre_params"
        checked[key] = MANOEUVRE_RANGES[key].check(value, f"{source}.{key}" if named else key,
                                                   "" if named else f"{source}: ")
    return checked


def manoeuvre_trajectory(name: str, duration_s: float, speed_kmh: float = 30.0, radius_m: float = 30.0,
                         accel_mps2: float = 2.0, lane_width_m: float = 3.5, change_s: float = 3.0,
                         rate_hz: float = 100.0) -> EgoTrajectory:
    """Synthesise a world-frame trajectory for a named manoeuvre starting at the origin, heading +x."""
    if name not in MANOEUVRES:
        raise TerraInputError(f"unknown manoeuvre {shown(name)}; choose one of: {', '.join(MANOEUVRES)}")
    Range(0, MAX_MANOEUVRE_S, 10, low_open=True).check(duration_s, "manoeuvre duration_s")
    Range(1, 1000, 100).check(rate_hz, "manoeuvre rate_hz")
    check_manoeuvre_params({"speed_kmh": speed_kmh, "radius_m": radius_m, "accel_mps2": accel_mps2,
                            "lane_width_m": lane_width_m, "change_s": change_s}, "manoeuvre parameters")
    t = np.arange(int(np.ceil(duration_s * rate_hz)) + 1) / rate_hz
    v0 = speed_kmh / 3.6
    if name == "accelerate":
        speed = np.minimum(v0 + accel_mps2 * t, MANOEUVRE_RANGES["speed_kmh"].high / 3.6)
    elif name in ("decelerate", "stop"):
        speed = np.maximum(v0 - accel_mps2 * t, 0.0)
    else:
        speed = np.full_like(t, v0)
    if name.startswith("curve"):
        sign = 1.0 if name == "curve_left" else -1.0
        yaw = sign * np.concatenate([[0.0], np.cumsum(speed[1:] / radius_m / rate_hz)])
        x = np.concatenate([[0.0], np.cumsum(speed[1:] * np.cos(yaw[:-1]) / rate_hz)])
        y = np.concatenate([[0.0], np.cumsum(speed[1:] * np.sin(yaw[:-1]) / rate_hz)])
        return EgoTrajectory(t=t, x=x, y=y, yaw=yaw)
    x = np.concatenate([[0.0], np.cumsum(speed[1:] / rate_hz)])
    if name.startswith("lane_change"):
        sign = 1.0 if name == "lane_change_left" else -1.0
        u = np.clip(t / change_s, 0.0, 1.0)
        lateral = sign * lane_width_m * (10 * u**3 - 15 * u**4 + 6 * u**5)  # minimum-jerk S-curve
        dlat = sign * lane_width_m * (30 * u**2 - 60 * u**3 + 30 * u**4) / change_s
        yaw = np.arctan2(dlat, np.maximum(speed, 1e-6))
        return EgoTrajectory(t=t, x=x, y=lateral, yaw=yaw)
    return EgoTrajectory(t=t, x=x, y=np.zeros_like(t), yaw=np.zeros_like(t))
