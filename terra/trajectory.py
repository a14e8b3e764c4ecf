"""Ego trajectories in a world frame, and named manoeuvres that synthesise them.

An :class:`EgoTrajectory` is a time-stamped 2-D pose track ``(t, x, y, yaw)`` (metres, radians, x forward
at yaw 0, y to the left). :meth:`EgoTrajectory.instruction_trajs` turns it into the per-frame future
trajectories of ACT-Bench (docs/ARCHITECTURE.md, "Actions") from which :mod:`terra.actions` takes the model's actions. Beyond its
last sample a trajectory continues at its final speed and yaw rate, so a clip of ``T`` frames needs only
``T`` frames' worth of poses rather than 3 s more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terra.errors import TerraInputError

FRAME_RATE_HZ = 10.0  # frames of a Terra clip
FUTURE_RATE_HZ = 20.0  # points of an instruction trajectory
FUTURE_POINTS = 60  # 3 s at 20 Hz


@dataclass(frozen=True)
class EgoTrajectory:
    """World-frame ego poses at increasing times."""

    t: np.ndarray  # [N] seconds, strictly increasing
    x: np.ndarray  # [N] metres
    y: np.ndarray  # [N] metres
    yaw: np.ndarray  # [N] radians, unwrapped

    @classmethod
    def from_arrays(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        yaw: np.ndarray | None = None,
        t: np.ndarray | None = None,
        rate_hz: float = FRAME_RATE_HZ,
        source: str = "trajectory",
    ) -> "EgoTrajectory":
        """Validate and build; ``yaw`` defaults to the direction of motion, ``t`` to samples at ``rate_hz``."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        n = len(x)
        if n < 2 or len(y) != n:
            raise TerraInputError(f"{source}: needs at least 2 points with as many x as y values (got {n} x, {len(y)} y)")
        t = np.arange(n) / rate_hz if t is None else np.asarray(t, dtype=np.float64).reshape(-1)
        if len(t) != n:
            raise TerraInputError(f"{source}: has {len(t)} timestamps for {n} points; give one timestamp per point")
        if yaw is None:
            yaw = _heading_from_motion(x, y)
        yaw = np.asarray(yaw, dtype=np.float64).reshape(-1)
        if len(yaw) != n:
            raise TerraInputError(f"{source}: has {len(yaw)} yaw values for {n} points; give one per point or none")
        for name, arr in (("t", t), ("x", x), ("y", y), ("yaw", yaw)):
            if not np.all(np.isfinite(arr)):
                raise TerraInputError(f"{source}: column {name} holds NaN or inf; replace them with finite values")
        if np.any(np.diff(t) <= 0):
            raise TerraInputError(f"{source}: timestamps must increase strictly; sort the points by time")
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
        x = np.interp(flat, self.t, self.x)
        y = np.interp(flat, self.t, self.y)
        yaw = np.interp(flat, self.t, self.yaw)
        late = flat > self.t[-1]
        if np.any(late):
            dt_last = self.t[-1] - self.t[-2]
            speed = np.hypot(self.x[-1] - self.x[-2], self.y[-1] - self.y[-2]) / dt_last
            rate = (self.yaw[-1] - self.yaw[-2]) / dt_last
            x[late], y[late], yaw[late] = _integrate_arc(
                self.x[-1], self.y[-1], self.yaw[-1], speed, rate, flat[late] - self.t[-1]
            )
        return np.stack([x, y, yaw], axis=-1).reshape(*times.shape, 3)

    def instruction_trajs(self, num_frames: int | None = None, fps: float = FRAME_RATE_HZ) -> np.ndarray:
        """Per-frame future trajectories ``[T, 60, 3]`` in each frame's ego frame (x fwd, y left, z=0)."""
        num_frames = self.num_frames(fps) if num_frames is None else num_frames
        frame_t = self.t[0] + np.arange(num_frames) / fps
        future_t = frame_t[:, None] + np.arange(FUTURE_POINTS)[None, :] / FUTURE_RATE_HZ
        ego = self.poses_at(frame_t)  # [T, 3]
        fut = self.poses_at(future_t)  # [T, 60, 3]
        dx = fut[..., 0] - ego[:, None, 0]
        dy = fut[..., 1] - ego[:, None, 1]
        c, s = np.cos(ego[:, 2])[:, None], np.sin(ego[:, 2])[:, None]
        local = np.stack([c * dx + s * dy, -s * dx + c * dy, np.zeros_like(dx)], axis=-1)
        return local.astype(np.float32)


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

MANOEUVRES = (
    "straight",
    "curve_left",
    "curve_right",
    "accelerate",
    "decelerate",
    "stop",
    "lane_change_left",
    "lane_change_right",
)


MANOEUVRE_PARAMS = ("speed_kmh", "radius_m", "accel_mps2", "lane_width_m", "change_s")  # user-settable parameters


def check_manoeuvre_params(params, source: str = "manoeuvre_params") -> dict[str, float]:
    """Validate manoeuvre parameters (names of :data:`MANOEUVRE_PARAMS`, numbers) and return them as floats.

    Parameters set to ``None`` are left out (the manoeuvre's default applies).
    """
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
        try:
            if isinstance(value, bool):
                raise TypeError
            checked[key] = float(value)
        except (TypeError, ValueError):
            raise TerraInputError(f"{source}: {key}={value!r} is not a number; e.g. {key}=30") from None
    return checked


def manoeuvre_trajectory(
    name: str,
    duration_s: float,
    speed_kmh: float = 30.0,
    radius_m: float = 30.0,
    accel_mps2: float = 2.0,
    lane_width_m: float = 3.5,
    change_s: float = 3.0,
    rate_hz: float = 100.0,
) -> EgoTrajectory:
    """Synthesise a world-frame trajectory for a named manoeuvre starting at the origin, heading +x.

    ``straight`` keeps ``speed_kmh``; ``curve_left/right`` follow a circle of ``radius_m``;
    ``accelerate``/``decelerate`` change speed by ``accel_mps2`` (never below 0); ``stop`` brakes to a
    standstill at ``accel_mps2``; ``lane_change_left/right`` move one ``lane_width_m`` sideways over
    ``change_s`` seconds along a smooth S-curve.
    """
    if name not in MANOEUVRES:
        raise TerraInputError(f"unknown manoeuvre {name!r}; choose one of: {', '.join(MANOEUVRES)}")
    if not (np.isfinite(duration_s) and duration_s > 0):
        raise TerraInputError(f"manoeuvre duration must be positive (got {duration_s})")
    for label, value in (("speed_kmh", speed_kmh), ("radius_m", radius_m), ("accel_mps2", accel_mps2),
                         ("lane_width_m", lane_width_m), ("change_s", change_s)):
        if not np.isfinite(value) or value < 0 or (value == 0 and label in ("radius_m", "change_s")):
            raise TerraInputError(f"manoeuvre parameter {label} must be a positive number (got {value})")
    t = np.arange(int(np.ceil(duration_s * rate_hz)) + 1) / rate_hz
    v0 = speed_kmh / 3.6
    if name == "accelerate":
        speed = v0 + accel_mps2 * t
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
