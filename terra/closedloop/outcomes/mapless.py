"""Closed-loop metrics of a drive that need no map: progress, comfort, plan consistency."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from terra.closedloop.plans import Plan
from terra.closedloop.car.path import TrackedPath
from terra.contract.actions import FRAME_RATE_HZ
from terra.inputs.ego_motion import compose, to_ego

DT_S = 1.0 / FRAME_RATE_HZ
HC_BOUNDS = {  # NAVSIM's history-comfort bounds: (low, high)
    "lon_accel": (-4.05, 2.40), "lat_accel": (-4.89, 4.89), "jerk": (-8.37, 8.37), "lon_jerk": (-4.13, 4.13),
    "yaw_accel": (-1.93, 1.93), "yaw_rate": (-0.95, 0.95),
}
EC_THRESHOLDS = {"accel": 0.7, "jerk": 0.5, "yaw_rate": 0.1, "yaw_accel": 0.1}  # NAVSIM's extended comfort (RMS)


def _grad(values: np.ndarray, dt: float) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return np.zeros_like(values)
    return np.gradient(values, dt, axis=0, edge_order=2 if len(values) >= 3 else 1)


def kinematics(poses: np.ndarray, dt: float = DT_S) -> dict[str, np.ndarray]:
    """Per-pose speed, accelerations, jerks, yaw rate and yaw acceleration of poses ``[T, 3]`` ``dt`` apart."""
    poses = np.asarray(poses, dtype=np.float64)
    velocity = _grad(poses[:, :2], dt)
    accel = _grad(velocity, dt)
    jerk = _grad(accel, dt)
    yaw = np.unwrap(poses[:, 2])
    lon_accel, lat_accel = to_ego(accel, np.c_[np.zeros_like(accel), yaw]).T  # along and across the heading
    yaw_rate = _grad(yaw, dt)
    return {
        "speed": np.linalg.norm(velocity, axis=-1), "lon_accel": lon_accel, "lat_accel": lat_accel,
        "accel": np.linalg.norm(accel, axis=-1), "jerk": np.linalg.norm(jerk, axis=-1),
        "lon_jerk": _grad(lon_accel, dt), "yaw_rate": yaw_rate, "yaw_accel": _grad(yaw_rate, dt),
    }


def history_comfort(poses: np.ndarray, dt: float = DT_S) -> dict[str, float | bool]:
    """NAVSIM's HC of a driven path: the extreme of each quantity and whether all stay within bounds."""
    if len(poses) < 3:
        return {"comfortable": True}
    k = kinematics(poses, dt)
    out: dict[str, float | bool] = {f"max_abs_{name}": float(np.abs(k[name]).max()) for name in HC_BOUNDS}
    out["min_lon_accel"], out["max_lon_accel"] = float(k["lon_accel"].min()), float(k["lon_accel"].max())
    out["comfortable"] = bool(all(((k[n] >= lo) & (k[n] <= hi)).all() for n, (lo, hi) in HC_BOUNDS.items()))
    return out


def plan_poses(plan: Plan, step: int, start: np.ndarray, dt: float = DT_S) -> tuple[np.ndarray, np.ndarray]:
    """A plan made at ``step`` (ego pose ``start``) resampled at 10 Hz in the drive's frame."""
    path = TrackedPath.from_plan(plan)
    grid = np.arange(0.0, path.times[-1] + 1e-9, dt)
    return step * dt + grid, compose(start, np.stack([path.pose_at(float(t)) for t in grid]))


def extended_comfort(plans: Sequence[Plan], poses: np.ndarray, dt: float = DT_S) -> dict[str, float | None]:
    """NAVSIM's EC over consecutive plans (``plans[k]`` made at ``poses[k]``)."""
    passed, worst = [], dict.fromkeys(EC_THRESHOLDS, 0.0)
    resampled = [plan_poses(plan, k, poses[k], dt) for k, plan in enumerate(plans)]  # each plan once, not twice
    for (t0, p0), (t1, p1) in zip(resampled, resampled[1:]):
        shared = t1[(t1 <= t0[-1] + 1e-9)]
        if len(shared) < 3:
            continue
        f0 = kinematics(np.stack([np.interp(shared, t0, p0[:, i]) for i in range(3)], -1), dt)
        f1 = kinematics(np.stack([np.interp(shared, t1, p1[:, i]) for i in range(3)], -1), dt)
        rms = {name: float(np.sqrt(np.mean((f0[name] - f1[name]) ** 2))) for name in EC_THRESHOLDS}
        passed.append(all(rms[n] <= EC_THRESHOLDS[n] for n in EC_THRESHOLDS))
        worst = {n: max(worst[n], rms[n]) for n in EC_THRESHOLDS}
    if not passed:
        return {"score": None}
    return {"score": float(np.mean(passed)), **{f"max_rms_{n}": v for n, v in worst.items()}}


def progress(poses: np.ndarray, dt: float = DT_S) -> dict[str, float]:
    """Distance driven along the path (m), straight-line displacement (m) and mean speed (m/s)."""
    poses = np.asarray(poses, dtype=np.float64)
    length = float(np.hypot(*np.diff(poses[:, :2], axis=0).T).sum()) if len(poses) > 1 else 0.0
    duration = (len(poses) - 1) * dt
    return {"distance_m": length, "displacement_m": float(np.hypot(*(poses[-1, :2] - poses[0, :2]))),
            "mean_speed_mps": length / duration if duration > 0 else 0.0}


def drive_metrics(poses: np.ndarray, plans: Sequence[Plan]) -> dict:
    """Every map-free metric of a drive from its poses ``[steps + 1, 3]`` (drive frame) and plans."""
    return {"progress": progress(poses), "history_comfort": history_comfort(poses),
            "extended_comfort": extended_comfort(plans, poses)}
