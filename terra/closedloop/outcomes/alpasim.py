"""AlpaSim's closed-loop metrics and scene score, computed from the true world's ground truth."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from terra.closedloop.scenarios import Scenario
from terra.closedloop.outcomes.truth import PARKED_LENGTH_M, parked_cars
from terra.contract.actions import FRAME_RATE_HZ
from terra.inputs.ego_motion import compose, to_ego, to_world
from terra.sim.scene import CAR, ROAD_HALF_WIDTH_M, Scene
from terra.stats import Bootstrap, mean

DT_S = 1.0 / FRAME_RATE_HZ
SHRINK = 0.02  # AlpaSim's eval.vehicle.vehicle_shrink_factor
ROUNDNESS = 0.5  # AlpaSim's eval.vehicle.vehicle_corner_roundness
ARC_SEGMENTS = 16  # per quarter circle of a rounded corner
SIDE_STEP_M = 0.5  # the box's straight sides are sampled this finely (the road's edge is curved)
TOUCH_M = 1e-3  # AlpaSim: offroad when the box comes this close to the road's edge
MAX_DIST_TO_GT_M = 4.0  # eval.aggregation_modifiers.max_dist_to_gt_trajectory
DURATION_S = 20.0  # duration_frac_20s
PROGRESS_SATURATION = 0.8  # scene_score.progress_saturation_threshold
MIN_GT_DISTANCE_M = 5.0  # scene_score.min_gt_distance_for_full_score_m
SUMMARIZED = ("collision_any", "collision_at_fault", "offroad", "wrong_lane", "progress", "progress_rel",
              "dist_to_gt_trajectory", "duration_frac_20s")  # the run summary's means beside the scene score
FLAGS = ("collision_front", "collision_rear", "collision_lateral", "collision_any", "collision_at_fault",
          "offroad", "offroad_or_collision", "offroad_or_collision_at_fault", "wrong_lane")  # true when any timestep is


@dataclass(frozen=True)
class VehicleBox:
    """A vehicle's box about its rear axle."""

    length_m: float = 5.393
    width_m: float = 2.109
    rear_m: float = 1.3  # from the rear axle back to the box's rear plane

    def centres(self, poses: np.ndarray) -> np.ndarray:
        """``[..., 3]`` box-centre poses of rear-axle ``poses [..., 3]``: ``aabb_x_offset_m + aabb_x_m / 2`` ahead."""
        return compose(np.asarray(poses, dtype=np.float64), [self.length_m / 2 - self.rear_m, 0.0, 0.0])


@dataclass(frozen=True)
class MetricBox:
    """A box as AlpaSim's metrics see it (``RAABB``)."""

    outline: np.ndarray  # [N, 2]
    length: float  # shrunk
    radius: float
    reach: float  # the farthest point of the outline from the centre

    @classmethod
    def of(cls, length: float, width: float, shrink: float = SHRINK, roundness: float = ROUNDNESS) -> "MetricBox":
        length, width = length * (1.0 - shrink), width * (1.0 - shrink)
        r = roundness * min(length, width) / 2
        hx, hy = length / 2 - r, width / 2 - r
        arcs = []
        for k, (cx, cy) in enumerate(((hx, hy), (-hx, hy), (-hx, -hy), (hx, -hy))):  # from the front-left corner
            angles = np.pi / 2 * (k + np.linspace(0.0, 1.0, ARC_SEGMENTS + 1 if r > 0 else 1))
            arcs.append(np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], axis=-1))
        outline = np.concatenate(arcs)
        return cls(outline, length, r, float(np.hypot(*outline.T).max()))

    def at(self, pose: np.ndarray) -> np.ndarray:
        """The polygon in the world, the box centred on ``pose [..., 3]`` (``[..., N, 2]``)."""
        return to_world(self.outline, np.asarray(pose, dtype=np.float64)[..., None, :])

    def dense(self, step: float) -> "MetricBox":
        """The same box, its straight sides sampled every ``step`` metres at most."""
        a, b = self.outline, np.roll(self.outline, -1, axis=0)
        n = np.maximum(1, np.ceil(np.hypot(*(b - a).T) / step)).astype(int)
        points = [a[i] + (b[i] - a[i]) * (np.arange(n[i]) / n[i])[:, None] for i in range(len(a))]
        return MetricBox(np.concatenate(points), self.length, self.radius, self.reach)


def clip(subject: np.ndarray, clipper: np.ndarray) -> np.ndarray:
    """The intersection of two convex counter-clockwise polygons (Sutherland-Hodgman)."""
    out = np.asarray(subject, dtype=np.float64)
    for a, b in zip(clipper, np.roll(clipper, -1, axis=0)):
        edge = b - a
        if not len(out) or not edge.any():
            continue
        side = edge[0] * (out[:, 1] - a[1]) - edge[1] * (out[:, 0] - a[0])  # >= 0: left of the edge, inside
        inside = side >= -1e-9
        kept = []
        for i in range(len(out)):
            j = (i + 1) % len(out)
            if inside[i]:
                kept.append(out[i])
            if inside[i] != inside[j]:
                kept.append(out[i] + (out[j] - out[i]) * (side[i] / (side[i] - side[j])))
        out = np.array(kept).reshape(-1, 2)
    return out


def collision_classes(ego: MetricBox, pose: np.ndarray, others: list[tuple[MetricBox, np.ndarray]]
                      ) -> tuple[bool, bool, bool]:
    """``(front, rear, lateral)`` of the ``ego`` box centred on ``pose``."""
    front = rear = lateral = False
    near = [(box, where) for box, where in others if np.hypot(*(where[:2] - pose[:2])) <= ego.reach + box.reach]
    if not near:  # the common step: no car within reach, no polygon to build
        return front, rear, lateral
    ego_polygon, band = ego.at(pose), ego.length / 2 - ego.radius
    for box, where in near:
        shared = clip(box.at(where), ego_polygon)
        if not len(shared):
            continue
        along = to_ego(shared, pose)[:, 0]
        if along.max() >= band - 1e-9:
            front = True
        elif along.min() <= -band + 1e-9:
            rear = True
        else:
            lateral = True
    return front, rear, lateral


def offroad(scene: Scene, box: MetricBox, poses: np.ndarray) -> np.ndarray:
    """``[T]`` whether ``box`` at each of ``poses [T, 3]`` is not within the asphalt and touches or crosses its edge."""
    polygons = box.dense(SIDE_STEP_M).at(poses)
    _, d = scene.road_coords(polygons[..., 0], polygons[..., 1])
    out = np.zeros(len(polygons), dtype=bool)
    for side in (-1.0, 1.0):
        out |= ((side * d).max(-1) > ROAD_HALF_WIDTH_M) & ((side * d).min(-1) <= ROAD_HALF_WIDTH_M + TOUCH_M)
    return out & np.isfinite(d).all(-1)


def wrong_lane(scene: Scene, poses: np.ndarray) -> np.ndarray:
    """``[T]`` whether box-centre ``poses [T, 3]`` head more than 2 pi / 3 away from their lane's direction."""
    s, d = scene.road_coords(poses[:, 0], poses[:, 1])
    own = np.sign(d) == np.sign(scene.ego_lane_offset_m)
    direction = scene.road_pose(s)[:, 2] + np.where(own, 0.0, np.pi)
    return np.abs(np.angle(np.exp(1j * (poses[:, 2] - direction)))) > 2 * np.pi / 3


def project(polyline: np.ndarray, points: np.ndarray, upto: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(along, distance)`` ``[T]`` of ``points [T, 2]`` on ``polyline [M, 2]``."""
    a, seg = polyline[:-1], np.diff(polyline, axis=0)
    if not len(seg):
        return np.zeros(len(points)), np.hypot(*(points - polyline[0]).T)
    length = np.hypot(*seg.T)
    offset = points[:, None, :] - a  # [T, M - 1, 2]
    t = np.clip((offset * seg).sum(-1) / np.where(length > 0, length**2, 1.0), 0.0, 1.0)
    if upto is not None:
        upto = np.asarray(upto)
        t[:, 0] = np.where(upto == 0, 0.0, t[:, 0])  # a polyline of one vertex: its only point
    gaps = np.hypot(*np.moveaxis(offset - t[..., None] * seg, -1, 0))
    if upto is not None:
        gaps = np.where(np.arange(len(seg)) < np.maximum(upto, 1)[:, None], gaps, np.inf)
    nearest = np.argmin(gaps, axis=-1)
    rows = np.arange(len(points))
    return np.r_[0.0, np.cumsum(length)][nearest] + t[rows, nearest] * length[nearest], gaps[rows, nearest]


def expert_trajectory(scene: Scene, start_pose: np.ndarray, speed_mps: float, steps: int) -> np.ndarray:
    """``[steps + 1, 3]`` rear-axle poses of the scenario's expert at ``t = 0, 0.1, ...``."""
    s0, _ = scene.road_coords(np.array([start_pose[0]], dtype=np.float64), np.array([start_pose[1]], dtype=np.float64))
    return scene.lane_pose(s0[0] + speed_mps * DT_S * np.arange(steps + 1))


def parked_boxes(scene: Scene) -> list[tuple[MetricBox, np.ndarray]]:
    """The scene's parked cars as metric boxes (4.5 m x their drawn width) and their poses, along the road."""
    widths = scene.objects.size[scene.objects.kind == CAR, 0]
    return [(MetricBox.of(PARKED_LENGTH_M, width), pose) for pose, width in zip(parked_cars(scene), widths)]


def timestep_metrics(scene: Scene, poses: np.ndarray, expert: np.ndarray,
                     vehicle: VehicleBox = VehicleBox()) -> dict[str, np.ndarray]:
    """Every per-timestep metric of rear-axle ``poses [T, 3]`` against the ``expert``'s ``[T, 3]`` (same times)."""
    centres = vehicle.centres(poses)
    gt = vehicle.centres(expert)[:, :2]
    box, cars = MetricBox.of(vehicle.length_m, vehicle.width_m), parked_boxes(scene)
    cumulative = np.r_[0.0, np.cumsum(np.hypot(*np.diff(gt, axis=0).T))]  # the expert's distance so far
    gt_length = float(cumulative[-1])
    along, distance = project(gt, centres[:, :2])
    along_so_far = project(gt, centres[:, :2], np.arange(len(gt)))[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        progress = along / gt_length if gt_length > 0 else np.ones(len(gt))
        progress_rel = np.where(cumulative > 0, along_so_far / cumulative, 1.0)
    classes = [collision_classes(box, centre, cars) for centre in centres]
    front, rear, lateral = np.array(classes, dtype=bool).reshape(-1, 3).T
    metrics = {
        "collision_front": front, "collision_rear": rear, "collision_lateral": lateral,
        "collision_any": front | rear | lateral, "collision_at_fault": front | lateral,
        "offroad": offroad(scene, box, centres), "wrong_lane": wrong_lane(scene, centres),
        "progress": progress, "progress_rel_to_total": progress, "progress_rel": progress_rel,
        "dist_to_gt_trajectory": distance,
        "dist_to_gt_location": np.hypot(*(centres[:, :2] - gt).T),
        "dist_traveled_m": np.r_[0.0, np.cumsum(np.hypot(*np.diff(centres[:, :2], axis=0).T))],
        "gt_dist_traveled_m": np.full(len(centres), gt_length),
        "duration_frac_20s": np.arange(len(centres)) * DT_S / DURATION_S,
    }
    metrics["offroad_or_collision"] = metrics["collision_any"] | metrics["offroad"]
    metrics["offroad_or_collision_at_fault"] = metrics["collision_at_fault"] | metrics["offroad"]
    return metrics


def truncation(metrics: dict[str, np.ndarray]) -> tuple[int, str | None]:
    """``(kept, cause)``."""
    event, far = metrics["offroad_or_collision"], metrics["dist_to_gt_trajectory"] >= MAX_DIST_TO_GT_M
    first = np.flatnonzero(event | far)
    if not len(first):
        return len(event), None
    return int(first[0]) + 1, "offroad_or_collision" if event[first[0]] else "dist_to_gt_trajectory"


def scene_score(collision_at_fault: bool, offroad: bool, progress_clipped_rel: float,
                gt_dist_traveled_m: float) -> tuple[float, float, str | None]:
    """AlpaSim's scene score of a drive: ``(score, progress_score, failure_reason)``."""
    progress_score = 1.0 if gt_dist_traveled_m < MIN_GT_DISTANCE_M else \
        min(min(max(progress_clipped_rel, 0.0), 1.0) / PROGRESS_SATURATION, 1.0)
    reason = "collision_at_fault" if collision_at_fault else "offroad" if offroad else None
    return (0.0 if reason else progress_score), progress_score, reason


LAST = ("progress", "progress_rel_to_total", "dist_traveled_m", "gt_dist_traveled_m", "duration_frac_20s")
MAXIMUM = ("dist_to_gt_trajectory", "dist_to_gt_location")


def drive_values(metrics: dict[str, np.ndarray]) -> dict:
    """A drive's AlpaSim metrics from its per-timestep ``metrics``: truncated, then aggregated in time, scored."""
    kept, cause = truncation(metrics)
    values: dict = {name: bool(metrics[name][:kept].any()) for name in FLAGS}
    values.update({name: float(metrics[name][kept - 1]) for name in LAST})
    values.update({name: float(metrics[name][:kept].max()) for name in MAXIMUM})
    values["progress_rel"] = float(metrics["progress_rel"][:kept].min())
    values["progress_clipped_rel"] = values["progress_rel_to_total"]
    score, progress_score, reason = scene_score(values["collision_at_fault"], values["offroad"],
                                                values["progress_clipped_rel"], values["gt_dist_traveled_m"])
    return {**values, "timesteps": len(metrics["offroad"]), "kept_timesteps": kept, "truncated_by": cause,
            "score": score, "progress_score": progress_score, "failure_reason": reason,
            "status": "fail" if reason else "pass"}


def alpasim_metrics(scenario: Scenario, world_poses: np.ndarray, error: str | None = None,
                    vehicle: VehicleBox = VehicleBox()) -> dict:
    """AlpaSim's metrics and scene score of rear-axle ``world_poses [steps + 1, 3]``; ``error``: the drive's failure."""
    if scenario.scene is None:
        raise ValueError(f"scenario {scenario.id} has no synthetic scene: AlpaSim's metrics need its ground truth")
    world_poses = np.asarray(world_poses, dtype=np.float64)
    expert = expert_trajectory(scenario.scene, scenario.start_pose, scenario.speed_kmh / 3.6, len(world_poses) - 1)
    values = drive_values(timestep_metrics(scenario.scene, world_poses, expert, vehicle))
    if error is not None:
        values.update(score=0.0, failure_reason=error, status="fail")
    return values


def scene_scores(drives: Iterable[dict], bootstrap: Bootstrap = Bootstrap()) -> dict | None:
    """A run's AlpaSim summary: mean scene score with its bootstrap interval, per policy too, and pass/fail counts."""
    rows = [(c["scenario"], c["policy"], c["metrics"]["alpasim"]) for c in drives
            if (c.get("metrics") or {}).get("alpasim")]
    if not rows:
        return None
    scenarios = [scenario for scenario, _, _ in rows]
    scores = np.array([values["score"] for _, _, values in rows], dtype=np.float64)
    by_policy = {}
    for policy in dict.fromkeys(policy for _, policy, _ in rows):
        mine = [i for i, (_, name, _) in enumerate(rows) if name == policy]
        by_policy[policy] = mean([scenarios[i] for i in mine], scores[mine], bootstrap).as_dict()
    reasons = Counter("passed" if values["failure_reason"] is None else values["failure_reason"]
                      if values["failure_reason"] in ("collision_at_fault", "offroad") else "drive_failed"
                      for _, _, values in rows)
    means = {name: mean(scenarios, np.array([float(v[name]) for _, _, v in rows]), bootstrap).as_dict()
             for name in SUMMARIZED}
    return {"drives": len(rows), "scenarios": len(set(scenarios)),
            "scene_score": mean(scenarios, scores, bootstrap).as_dict(), "by_policy": by_policy,
            "failure_reasons": dict(reasons), "means": means}
