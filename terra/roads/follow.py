"""The one place a world-frame road becomes ego routes: each pose's route in the contract's layout."""

from __future__ import annotations

from itertools import islice

import numpy as np

from terra.contract.routes import (MAX_LANE_DISTANCE_M, NO_LANE_NEAR, ROAD_ENDED, ROUTE_HORIZON_M, TOLD, no_route,
                                   route_distances, routes_from_xy)
from terra.core.errors import TerraInputError
from terra.roads.road import MAX_COORDINATE_M, Road

MAX_HEADING_RAD = np.radians(60.0)  # a lane heading farther than this from the car's is not the car's lane
AHEAD_MARGIN_M = 0.25  # a branch is the one the known poses take when it is this much nearer them than the others
LANE_TIE_M = 1.0  # lanes this close to as near the car as its nearest are told apart by the known poses
MAX_BRANCHES = 4  # branches weighed at a fork (the straightest first) or where lanes tie at the car (the nearest)
MAX_KNOWN_POINTS = 64  # known points weighed at a fork, evenly picked from those within reach
MAX_LANE_VISITS = 256  # lanes one frame's route follows, and as many its forks' branches look at: a frame's work
MIN_ROAD_AHEAD_M = ROUTE_HORIZON_M / 2  # a road ending nearer than this ahead tells no route ("road ended")


def route_at(road: Road, pose: np.ndarray, route_tokens: int, ahead: np.ndarray | None = None) -> np.ndarray:
    """The route ``[K, 3]`` (``K = route_tokens``) of world ``pose`` ``(x, y, yaw)`` along ``road``."""
    return told_route_at(road, pose, route_tokens, ahead)[0]


def told_route_at(road: Road, pose: np.ndarray, route_tokens: int,
                  ahead: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """:func:`route_at` and its status: ``TOLD``, ``NO_LANE_NEAR`` or ``ROAD_ENDED``."""
    pose = _pose(pose)
    known = None if ahead is None or len(ahead) == 0 else np.atleast_2d(np.asarray(ahead, dtype=np.float64))[:, :2]
    branches = _Budget()  # then a fork takes the straightest
    found = _car_lane(road, pose, known, branches)
    if found is None:
        return no_route(1, route_tokens)[0], NO_LANE_NEAR
    lane, s0 = found
    world, reach = _follow(road, lane, s0, route_distances(route_tokens).astype(np.float64), known, branches)
    if reach < MIN_ROAD_AHEAD_M:
        return no_route(1, route_tokens)[0], ROAD_ENDED
    c, s = np.cos(pose[2]), np.sin(pose[2])
    d = world - pose[:2]
    forward, left = c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1]
    return routes_from_xy(np.stack([forward, left], axis=-1)), TOLD


def routes_along(road: Road, poses: np.ndarray, route_tokens: int,
                 ahead_poses: np.ndarray | None = None) -> np.ndarray:
    """Routes ``[T, K, 3]`` of world ``poses`` ``[T, 3]``, each told the poses after it (then ``ahead_poses``)."""
    return told_routes_along(road, poses, route_tokens, ahead_poses)[0]


def told_routes_along(road: Road, poses: np.ndarray, route_tokens: int,
                      ahead_poses: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
    """:func:`routes_along` and each frame's :func:`told_route_at` verdict."""
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] != 3:
        raise TerraInputError(f"routes along a road: poses must be [frames, 3] (x, y, yaw), got {list(poses.shape)}")
    later = poses[:, :2]
    if ahead_poses is not None and len(ahead_poses):
        later = np.concatenate([later, np.asarray(ahead_poses, dtype=np.float64)[:, :2]])
    out, told = np.empty((len(poses), route_tokens, 3), dtype=np.float32), []
    for t, pose in enumerate(poses):
        out[t], verdict = told_route_at(road, pose, route_tokens, later[t + 1:])
        told.append(verdict)
    return out, told


def nearest_lane(road: Road, pose: np.ndarray) -> tuple[float, float] | None:
    """Distance (m) to ``pose``'s nearest lane point and the heading gap there (degrees)."""
    if not len(road.segment_starts):
        return None
    pose = _pose(pose)
    first = road.segment_starts
    k = int(np.argmin(np.hypot(*(road.xy[first] - pose[:2]).T)))
    d = road.xy[first[k] + 1] - road.xy[first[k]]
    turn = np.angle(np.exp(1j * (np.arctan2(d[1], d[0]) - pose[2])))
    return float(np.hypot(*(road.xy[first[k]] - pose[:2]))), float(np.degrees(abs(turn)))


class _Budget:
    """The lanes a frame's route may still follow, or its branches look at (:data:`MAX_LANE_VISITS`)."""

    def __init__(self) -> None:
        self.left = MAX_LANE_VISITS

    def take(self) -> bool:
        """Spend one lane's look; False once none is left."""
        self.left -= 1
        return self.left >= 0


def _pose(pose: np.ndarray) -> np.ndarray:
    pose = np.asarray(pose, dtype=np.float64)
    if pose.shape != (3,) or not np.isfinite(pose).all():
        raise TerraInputError(f"route at a pose: the pose must be 3 finite numbers (x, y, yaw), got {pose.tolist()}")
    return pose


def _car_lane(road: Road, pose: np.ndarray, ahead: np.ndarray | None, budget: _Budget) -> tuple[int, float] | None:
    """(lane, arc length) of the car's point on its lane."""
    if not len(road) or np.abs(pose[:2]).max() > MAX_COORDINATE_M + road.cells.cell_m:
        return None
    first = road.segment_starts[road.cells.near(pose[:2])]
    if not len(first):
        return None
    a, b = road.xy[first], road.xy[first + 1]
    seg = b - a
    length2 = np.einsum("ij,ij->i", seg, seg)
    raw = np.einsum("ij,ij->i", pose[:2] - a, seg) / length2
    t = np.clip(raw, 0.0, 1.0)
    dist = np.hypot(*(a + t[:, None] * seg - pose[:2]).T)
    along_car = seg @ np.array([np.cos(pose[2]), np.sin(pose[2])])
    dist = np.where(along_car >= np.cos(MAX_HEADING_RAD) * np.sqrt(length2), dist, np.inf)  # heading within bound
    best = int(np.argmin(dist))
    if not dist[best] <= MAX_LANE_DISTANCE_M:
        return None
    along = road.along[first] + t * (road.along[first + 1] - road.along[first])
    lanes = road.lane_of[first]
    beyond = ((raw > 1.0) & (first + 2 == road.starts[lanes + 1])) | ((raw < 0.0) & (first == road.starts[lanes]))
    tied = np.flatnonzero((dist <= dist[best] + LANE_TIE_M) & ~beyond & (lanes != lanes[best]))  # a lane the car
    tied = tied[np.argsort(dist[tied], kind="stable")]  # is before or past is no other choice
    _, nearest = np.unique(lanes[tied], return_index=True)  # each other lane's nearest point
    options = [best, *tied[np.sort(nearest)][: MAX_BRANCHES - 1].tolist()]
    if ahead is not None and len(options) > 1:
        chosen = _nearest_to(ahead, pose[:2], [_branch_points(road, int(lanes[k]), along[k], budget) for k in options])
        best = best if chosen is None else options[chosen]
    return int(lanes[best]), float(along[best])


def _follow(road: Road, lane: int, s0: float, distances: np.ndarray, ahead: np.ndarray | None,
            budget: _Budget) -> tuple[np.ndarray, float]:
    """World points ``[K, 2]`` ``distances`` metres along the road from ``s0`` on ``lane``, clamped at its end."""
    lanes, offsets = [lane], [-s0]  # the route distance at which each followed lane starts
    visited, reach, hops = {lane}, road.lengths[lane] - s0, _Budget()
    while reach < distances[-1] and hops.take():
        following = _next_lane(road, lanes[-1], visited, ahead, budget)
        if following is None:
            break
        lanes.append(following)
        visited.add(following)
        offsets.append(reach)
        reach += road.lengths[following]
    which = np.clip(np.searchsorted(offsets, distances, side="right") - 1, 0, len(lanes) - 1)
    out = np.empty((len(distances), 2))
    for j in np.unique(which):
        rows = which == j
        out[rows] = road.point_at(lanes[j], distances[rows] - offsets[j])
    return out, reach


def _options(road: Road, lane: int, visited: set[int]) -> list[int]:
    """The :data:`MAX_BRANCHES` straightest lanes ``lane`` leads into that are not ``visited``."""
    return list(islice((j for j in road.next_lanes[lane] if j not in visited), MAX_BRANCHES))


def _next_lane(road: Road, lane: int, visited: set[int], ahead: np.ndarray | None, budget: _Budget) -> int | None:
    """The lane after ``lane``: its one successor, at a fork the branch ``ahead`` takes, else the straightest."""
    options = _options(road, lane, visited)
    if len(options) <= 1:
        return options[0] if options else None
    if ahead is not None and budget.left > 0:
        branches = [_branch_points(road, j, 0.0, budget, visited) for j in options]
        chosen = _nearest_to(ahead, road.lane_points(lane)[-1], branches)
        if chosen is not None:
            return options[chosen]
    return options[0]


def _nearest_to(ahead: np.ndarray, place: np.ndarray, branches: list[np.ndarray]) -> int | None:
    """The branch (index) the ``ahead`` points near ``place`` lie nearest, by :data:`AHEAD_MARGIN_M` at least."""
    known = ahead[np.hypot(*(ahead - place).T) <= ROUTE_HORIZON_M]
    if not len(known):
        return None
    if len(known) > MAX_KNOWN_POINTS:
        known = known[np.linspace(0, len(known) - 1, MAX_KNOWN_POINTS).round().astype(np.int64)]
    gaps = np.array([_mean_gap(known, points) for points in branches])
    order = np.argsort(gaps, kind="stable")
    return int(order[0]) if gaps[order[1]] - gaps[order[0]] >= AHEAD_MARGIN_M else None


def _branch_points(road: Road, lane: int, start: float, budget: _Budget, visited: set[int] = frozenset()) -> np.ndarray:
    """The points of ``lane`` from ``start`` m on and its straightest continuation, up to :data:`ROUTE_HORIZON_M`."""
    walked = {*visited, lane}
    parts = [road.point_at(lane, start)[None], _lane_part(road, lane, start, start + ROUTE_HORIZON_M)]
    reach = road.lengths[lane] - start
    while reach < ROUTE_HORIZON_M and budget.take():
        options = _options(road, lane, walked)
        if not options:
            break
        lane = options[0]
        walked.add(lane)
        parts.append(_lane_part(road, lane, 0.0, ROUTE_HORIZON_M - reach))
        reach += road.lengths[lane]
    return np.concatenate(parts)


def _lane_part(road: Road, lane: int, start: float, stop: float) -> np.ndarray:
    """The points of ``lane`` after ``start`` up to ``stop`` metres along it."""
    if start <= 0.0 and stop >= road.lengths[lane]:
        return road.lane_points(lane)
    along = road.lane_along(lane)
    first, last = np.searchsorted(along, [start, stop], side="right")
    return road.lane_points(lane)[first:last]


def _mean_gap(points: np.ndarray, polyline: np.ndarray) -> float:
    """Mean over ``points`` of the distance to the nearest of ``polyline``'s points."""
    gaps = np.hypot(points[:, None, 0] - polyline[None, :, 0], points[:, None, 1] - polyline[None, :, 1])
    return float(gaps.min(axis=1).mean())


__all__ = ["MAX_HEADING_RAD", "MAX_LANE_DISTANCE_M", "MIN_ROAD_AHEAD_M", "nearest_lane", "route_at", "routes_along",
           "told_route_at", "told_routes_along"]
