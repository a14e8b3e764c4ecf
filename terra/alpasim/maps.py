"""AlpaSim's HD map in a session: read once at ``start_session``, and each chunk's frames' routes from it.

``StaticWorldMap.hdmap_parquets`` is read by terra/roads/clipgt.py (``read_clipgt``: its unpacked size, rows and
points bounded; a map it cannot take is one line naming the element and the field, which the service answers with
INVALID_ARGUMENT) into a road in the clip's world frame. That frame is AlpaSim's per-scene local frame, the frame of
the chunk's rig poses, so a frame's route is the road ahead of the rig's planar pose as terra/alpasim/poses.py reads
it (``planar_poses``: x, y and yaw in the local frame; the rig origin is Terra's ego origin), with no transform
between them. Each pose's route is ``routes_along`` (terra/roads/follow.py) over the chunk's poses: the chunk's later
poses are the points known ahead, which choose the branch at a fork; beyond the chunk AlpaSim has decided nothing,
so a chunk that ends before the branches part follows the straightest.

Only a model with route slots reads the map; a model without them ignores it (one log line a session). No map
(empty bytes), a map without lanes, or a car with no lane near it (terra/roads/follow.py's bounds), runs without a
route: the contract's "no route" rows (terra/contract/routes.py), and one log line a session says so. The memory a
map's reading freed is released to the system once it is read (:func:`release_map_memory`).
"""

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
        """The routes the session's rollout opens with: its one context frame's, which no route slot holds (frame
        ``t``'s slots hold ``routes[t + 1]``, terra/contract/routes.py), so "no route" rows; None where the session
        has no road (the backend then says once that a rollout runs without a route)."""
        return None if self.road is None else no_route(1, self.route_tokens)

    def routes(self, poses: np.ndarray) -> np.ndarray | None:
        """The routes ``[m, K, 3]`` of a chunk's frames at their planar rig ``poses`` ``[m, 3]`` (the local frame),
        each told the chunk's later poses; None without a road. The first frame without a lane near the car is
        logged, once a session."""
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
    """Return the memory a map's reading freed to the system: Arrow's pool keeps it for its next tables, and
    glibc's heap the Python objects' (a long-running server would hold a map's peak for every later session)."""
    import sys

    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator releases memory on its own terms
        pass


def session_map(data: bytes, route_tokens: int, session_id: str) -> SessionMap:
    """The map of a session whose model has ``route_tokens`` route slots, from ``hdmap_parquets`` ``data``; a map
    that cannot be read raises one :class:`~terra.core.errors.TerraInputError` line naming the element and the
    field. Each outcome is one log line."""
    if not route_tokens:
        log.info("session %s: the world model has no route slots, so the HD map (%d bytes) is not read",
                 session_id, len(data))
        return SessionMap(session_id, None, 0)
    if not data:
        log.info("session %s: no HD map (%s is empty): the model runs without a route", session_id, MAP_FIELD)
        return SessionMap(session_id, None, route_tokens)
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
