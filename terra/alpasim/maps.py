"""AlpaSim's HD map in a session: each frame's route from it, and condition frames showing what each was told."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from terra.contract.routes import ROAD_ENDED, ROUTE_HORIZON_M, TOLD, no_route
from terra.inputs.ego_motion import to_ego
from terra.roads import Road, read_clipgt, told_routes_along
from terra.roads.follow import MAX_HEADING_RAD, MAX_LANE_DISTANCE_M, MIN_ROAD_AHEAD_M


log = logging.getLogger("terra.alpasim")
MAP_FIELD = "static_world_map.hdmap_parquets"


@dataclass
class SessionMap:
    """A session's road (None: not read, or read without lanes) and what it has told the log."""

    session_id: str
    road: Road | None
    route_tokens: int  # the model's route slots (K); 0: a model without them
    told_off_road: bool = False

    def context_routes(self) -> np.ndarray | None:
        """The routes the session's rollout opens with."""
        return None if self.road is None else no_route(1, self.route_tokens)

    def routes(self, poses: np.ndarray) -> np.ndarray | None:
        """Routes ``[m, K, 3]`` of a chunk's planar rig ``poses`` ``[m, 3]``; None without a road."""
        if self.road is None:
            return None
        routes, told = told_routes_along(self.road, poses, self.route_tokens)
        lost = [t for t, verdict in enumerate(told) if verdict != TOLD]
        if lost and not self.told_off_road:
            self.told_off_road = True
            x, y, yaw = poses[lost[0]]
            why = (f"the HD map's road ends within {MIN_ROAD_AHEAD_M:.0f} m ahead" if told[lost[0]] == ROAD_ENDED else
                   f"no lane of the HD map within {MAX_LANE_DISTANCE_M:.0f} m of the rig heading within "
                   f"{np.degrees(MAX_HEADING_RAD):.0f} degrees")
            log.info("session %s: %s at (%.1f, %.1f, yaw %.2f): such frames run without a route (said once a "
                     "session)", self.session_id, why, x, y, yaw)
        return routes


def release_map_memory() -> None:
    """Return the memory a map's reading freed to the system."""
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator releases memory on its own terms
        ctypes.CDLL(None).malloc_trim(0)


def session_map(data: bytes, route_tokens: int, session_id: str) -> SessionMap:
    """The map of a session whose model has ``route_tokens`` route slots, from ``hdmap_parquets`` ``data``."""
    if not data:
        log.info("session %s: no HD map (%s is empty): the model runs without a route", session_id, MAP_FIELD)
        return SessionMap(session_id, None, route_tokens)
    if not route_tokens:
        log.info("session %s: the world model has no route slots, so the HD map (%d bytes) is not read",
                 session_id, len(data))
        return SessionMap(session_id, None, 0)
    start = time.perf_counter()
    try:
        road = read_clipgt(data, MAP_FIELD)
    finally:
        release_map_memory()
    seconds = time.perf_counter() - start
    if not len(road):
        log.info("session %s: the HD map (%d bytes) holds no lanes: the model runs without a route", session_id,
                 len(data))
        return SessionMap(session_id, None, route_tokens)
    log.info("session %s: HD map of %d lanes and %d road boundaries read in %.3f s; each frame is told the route "
             "ahead of its rig pose (%d points)", session_id, len(road), len(road.boundaries), seconds, route_tokens)
    return SessionMap(session_id, road, route_tokens)


VIEW_AHEAD_M = ROUTE_HORIZON_M + 10.0
VIEW_BEHIND_M = 6.0
REFRESH_M = 200.0  # the map's points within this of the view's reach are kept, and kept again after the car moves
BACKGROUND = (24, 24, 24)
LANE_COLOR = (100, 100, 100)
BOUNDARY_COLOR = (180, 180, 180)
ROUTE_COLOR = (255, 200, 0)
RIG_COLOR = (0, 190, 255)


class TopView:
    """Top views of ``road`` (None: no map drawn) at ``size`` ``(H, W)`` pixels."""

    def __init__(self, road: Road | None, size: tuple[int, int]) -> None:
        self.height, self.width = size
        self.px_per_m = self.height / (VIEW_AHEAD_M + VIEW_BEHIND_M)
        self.origin = np.array([self.width / 2.0, self.height - VIEW_BEHIND_M * self.px_per_m])
        self.reach = float(np.hypot(self.width / 2.0 / self.px_per_m, VIEW_AHEAD_M))  # the farthest point in view
        lines = [] if road is None else [*(road.lane_points(i) for i in range(len(road))), *road.boundaries]
        self.lanes = 0 if road is None else len(road)
        self.points = np.concatenate(lines) if lines else np.zeros((0, 2))
        self.owner = np.repeat(np.arange(len(lines)), [len(line) for line in lines])
        self._centre: np.ndarray | None = None
        self._kept = np.zeros(0, dtype=np.int64)

    def draw(self, pose: np.ndarray, route: np.ndarray | None) -> np.ndarray:
        """The picture ``[H, W, 3]`` uint8 of world ``pose`` ``(x, y, yaw)`` told ``route`` ``[K, 3]`` (None: no
        route)."""
        image = Image.new("RGB", (self.width, self.height), BACKGROUND)
        draw = ImageDraw.Draw(image)
        for run, owner in self._runs_in_view(pose):
            points = self._pixels(to_ego(self.points[run], pose))
            draw.line(points, fill=LANE_COLOR if owner < self.lanes else BOUNDARY_COLOR, width=1)
        if route is None or not np.isfinite(route).all():
            draw.text((4, 2), "no route", fill=ROUTE_COLOR)
        else:
            ahead = self._pixels(np.asarray(route, dtype=np.float64)[:, :2])
            draw.line([tuple(self.origin), *ahead], fill=ROUTE_COLOR, width=2)
            for u, v in ahead:
                draw.ellipse([u - 2, v - 2, u + 2, v + 2], fill=ROUTE_COLOR)
        u, v = self.origin
        size = max(3.0, 2.0 * self.px_per_m)
        draw.polygon([(u, v - 2 * size), (u - size, v + size), (u + size, v + size)], fill=RIG_COLOR)
        return np.asarray(image)

    def _runs_in_view(self, pose: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The stretches of the map's polylines within reach of ``pose``: (point indices, polyline)."""
        if not len(self.points):
            return []
        xy = np.asarray(pose[:2], dtype=np.float64)
        if self._centre is None or np.hypot(*(xy - self._centre)) > REFRESH_M:
            self._centre = xy
            self._kept = np.flatnonzero((np.abs(self.points - xy) <= self.reach + REFRESH_M).all(axis=1))
        near = self._kept[(np.abs(self.points[self._kept] - xy) <= self.reach).all(axis=1)]
        breaks = np.flatnonzero((np.diff(near) != 1) | (np.diff(self.owner[near]) != 0)) + 1
        return [(run, int(self.owner[run[0]])) for run in np.split(near, breaks) if len(run) > 1]

    def _pixels(self, forward_left: np.ndarray) -> list[tuple[float, float]]:
        """``(forward, left)`` metres → ``(u, v)`` pixels: forward up, left to the left."""
        u = self.origin[0] - forward_left[:, 1] * self.px_per_m
        v = self.origin[1] - forward_left[:, 0] * self.px_per_m
        return list(zip(u.tolist(), v.tolist()))
