"""Ground truth of a drive in the true world: where the ego poses put the car in the true scene."""

from __future__ import annotations

import numpy as np

from terra.closedloop.car.vehicle import EGO_LENGTH_M, EGO_WIDTH_M
from terra.inputs.ego_motion import to_world
from terra.sim.scene import CAR, LANE_WIDTH_M, ROAD_HALF_WIDTH_M, Scene

PARKED_LENGTH_M = 4.5
OUT_OF_LANE_M = (LANE_WIDTH_M - EGO_WIDTH_M) / 2  # 0.85 m: the body touches a lane line beyond this offset


def corners(pose: np.ndarray, length: float, width: float) -> np.ndarray:
    """``[4, 2]`` corners of a ``length`` x ``width`` rectangle centred on ``pose`` (x, y, yaw)."""
    return to_world(np.array([[1, 1], [1, -1], [-1, -1], [-1, 1]]) * [length / 2, width / 2], pose)


def overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two convex quadrilaterals ``[4, 2]`` overlap (separating axis test)."""
    for poly in (a, b):
        edges = np.roll(poly, -1, axis=0) - poly
        for normal in np.stack([-edges[:, 1], edges[:, 0]], axis=-1):
            pa, pb = a @ normal, b @ normal
            if pa.max() < pb.min() or pb.max() < pa.min():
                return False
    return True


def parked_cars(scene: Scene) -> np.ndarray:
    """``[K, 3]`` poses of the scene's parked cars, heading along the road."""
    xy = scene.objects.xy[scene.objects.kind == CAR]
    if not len(xy):
        return np.zeros((0, 3))
    s, _ = scene.road_coords(xy[:, 0], xy[:, 1])
    return np.concatenate([xy, scene.road_pose(s)[:, 2:]], axis=-1)


def truth_metrics(scene: Scene, drive_poses: np.ndarray) -> dict:
    """Lane, road, collision and progress metrics of a drive whose world poses are ``drive_poses [steps + 1, 3]``."""
    drive_poses = np.asarray(drive_poses, dtype=np.float64)
    world_poses = drive_poses[1:]
    if not len(world_poses):
        return {"frames": 0}
    s, d = scene.road_coords(world_poses[:, 0], world_poses[:, 1])
    offset = d - scene.ego_lane_offset_m
    heading = world_poses[:, 2] - scene.road_pose(s)[:, 2]
    reach = np.abs(np.sin(heading)) * EGO_LENGTH_M / 2 + np.abs(np.cos(heading)) * EGO_WIDTH_M / 2
    off_road = ~np.isfinite(d) | (np.abs(d) + reach > ROAD_HALF_WIDTH_M)
    out_of_lane = ~np.isfinite(offset) | (np.abs(offset) > OUT_OF_LANE_M)
    cars = parked_cars(scene)
    hits = []
    for k, pose in enumerate(world_poses):
        near = cars[np.hypot(*(cars[:, :2] - pose[:2]).T) < EGO_LENGTH_M + PARKED_LENGTH_M] if len(cars) else cars
        if any(overlap(corners(pose, EGO_LENGTH_M, EGO_WIDTH_M), corners(car, PARKED_LENGTH_M, EGO_WIDTH_M))
               for car in near):
            hits.append(k)
    start = scene.road_coords(drive_poses[:1, 0], drive_poses[:1, 1])[0]
    road = np.unwrap(scene.road_pose(np.concatenate([start, s]))[:, 2])
    series = {"lane_offset_m": offset, "heading_error_rad": np.angle(np.exp(1j * heading)),  # wrapped to [-pi, pi]
              "out_of_lane": out_of_lane, "off_road": off_road}
    return {**_summary(series), "collision": bool(hits), "first_collision_frame": hits[0] if hits else None,
            "progress_along_road_m": float(s[-1] - start[0]),
            "road_turn_rad": float(np.abs(road - road[0]).max()),
            "per_frame": {key: np.round(np.asarray(values, dtype=np.float64), 4).tolist()
                          for key, values in series.items()}}


def _summary(series: dict[str, np.ndarray]) -> dict:
    """The drive's lane, heading and road metrics from their values frame by frame."""
    offset, heading = np.asarray(series["lane_offset_m"], float), np.asarray(series["heading_error_rad"], float)
    out_of_lane, off_road = np.asarray(series["out_of_lane"], bool), np.asarray(series["off_road"], bool)
    finite = np.abs(offset[np.isfinite(offset)])
    signed = offset[np.isfinite(offset)]
    angle = heading[np.isfinite(heading)]
    return {
        "frames": int(len(offset)),
        "mean_abs_lane_offset_m": float(finite.mean()) if len(finite) else None,
        "max_abs_lane_offset_m": float(finite.max()) if len(finite) else None,
        "mean_lane_offset_m": float(signed.mean()) if len(signed) else None,
        "mean_heading_error_rad": float(angle.mean()) if len(angle) else None,
        "time_in_lane": float(1.0 - out_of_lane.mean()),
        "time_out_of_lane_s": float(out_of_lane.sum() / 10.0),
        "off_road": bool(off_road.any()),
        "time_off_road_s": float(off_road.sum() / 10.0),
    }


def metrics_until(metrics: dict, frames: int) -> dict | None:
    """The drive's lane, heading and road metrics over its first ``frames`` frames (None: not recorded)."""
    series = metrics.get("per_frame")
    if not series or frames < 1:
        return None
    return _summary({key: np.array(values[:frames], dtype=np.float64) for key, values in series.items()})
