"""AlpaSim's HD map in a session: read once at ``start_session``, and each chunk's frames' routes from it."""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass

import numpy as np

from terra.contract.routes import ROAD_ENDED, TOLD, no_route
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
    import sys

    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator releases memory on its own terms
        pass


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
