"""The routes a trajectory carries, as a person writes them: a road in the trajectory's own world frame, or each
frame's route in its ego frame, x first like every other point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import orjson

from terra.contract.routes import ROAD_ENDED, TOLD
from terra.core.errors import TerraInputError, clipped, error_reason
from terra.inputs.context import resolve_path
from terra.inputs.trajectory import EgoTrajectory
from terra.roads import Road, read_clipgt, read_road_file, road_from_json, told_routes_along
from terra.roads.follow import MAX_HEADING_RAD, MAX_LANE_DISTANCE_M, MIN_ROAD_AHEAD_M, nearest_lane

ROAD, EGO_ROUTES = "road", "ego_routes"
ROUTE_KEYS = (ROAD, EGO_ROUTES)  # the routes a trajectory may carry beside its form
ROUTE_HINTS = {ROAD: ROAD, "roads": ROAD, EGO_ROUTES: EGO_ROUTES, "routes": EGO_ROUTES, "route": EGO_ROUTES}
ROUTE_FORMS = ('"road": [[x, y], ...] (the road in the trajectory\'s world frame) or "ego_routes": one [[x, y], ...] '
               "per frame (its ego frame)")


@dataclass(frozen=True)
class GivenRoutes:
    """The routes a mapping gives under ``key``: a :class:`~terra.roads.Road`, None (no route) or per-frame routes."""

    key: str
    value: Any
    where: str

    @property
    def source(self) -> str:
        """Where the routes are, for error lines: ``bend.json: ego_routes``."""
        return f"{self.where}: {self.key}"


def given_routes(mapping: Mapping, where: str, base: Path | None = None) -> GivenRoutes | None:
    """The routes ``mapping`` gives (None: no key gives any), a road read relative to ``base``."""
    present = [key for key in ROUTE_KEYS if mapping.get(key) is not None]
    if len(present) > 1:
        raise TerraInputError(f"{where}: gives {' and '.join(present)}; give one: {ROUTE_FORMS}")
    if not present:
        null = [key for key in ROUTE_KEYS if key in mapping]
        return GivenRoutes(null[0], None, where) if null else None
    key = present[0]
    value = mapping[key]
    if key == ROAD:
        if isinstance(value, str) and not value.lstrip().startswith("["):
            value = resolve_path(value, base or Path())
        value = road_of_setting(value, f"{where}: {key}")
    return GivenRoutes(key, value, where)


def road_of_setting(value: Any, setting: str = "road") -> Road:
    """The road a ``road=`` setting gives: a road file, AlpaSim's map (``.zip`` or folder) or inline JSON."""
    if not isinstance(value, str):
        return road_from_json(list(value) if isinstance(value, tuple) else value, setting)
    if value.lstrip().startswith("["):
        try:
            return road_from_json(orjson.loads(value), setting)
        except orjson.JSONDecodeError as err:
            raise TerraInputError(f"{setting}: is not valid JSON ({error_reason(err)}); give a road file or "
                                  "[[x, y], ...]") from None
    path = Path(value)
    if path.is_dir() or path.suffix.lower() == ".zip":
        if not path.exists():
            raise TerraInputError(f"{setting}={clipped(value)}: does not exist; give a clipgt map (.zip or folder)")
        return read_clipgt(path, f"{setting}={clipped(value)}")
    if path.suffix.lower() in (".json", ".csv"):
        return read_road_file(path)
    raise TerraInputError(f"{setting}={clipped(value)}: give a road file (.json, .csv), AlpaSim's map (a .zip or a "
                          "clipgt folder) or [[x, y], ...]")


def road_routes(road: Road, motion: EgoTrajectory, ticks: np.ndarray, route_tokens: int,
                source: str) -> tuple[np.ndarray, list[str]]:
    """Routes ``[T, K, 3]`` along ``road`` at ``motion``'s poses at ``ticks``, and which frames were told theirs."""
    later = motion.t > ticks[-1]  # the car's path beyond the frames
    return told_road_routes(road, motion.poses_at(ticks), route_tokens, source,
                            np.stack([motion.x[later], motion.y[later]], -1))


def told_road_routes(road: Road, poses: np.ndarray, route_tokens: int, source: str, ahead: np.ndarray | None = None,
                     frame: str = "the trajectory's world frame") -> tuple[np.ndarray, list[str]]:
    """Routes ``[T, K, 3]`` along ``road`` at world ``poses`` ``[T, 3]`` and each frame's verdict; one line when no
    frame gets a route (``frame`` names the frame the road must be given in)."""
    routes, told = told_routes_along(road, poses, route_tokens, ahead)
    start = len(poses) == 1  # the car at the start (a session's, a drive's), not a drive's frames
    if ROAD_ENDED in told and TOLD not in told:
        where, which = ("the car", "it has no") if start else ("every frame that lies on a lane", "no frame has a")
        raise TerraInputError(f"{source}: the road ends within {MIN_ROAD_AHEAD_M:g} m ahead of {where}, so {which} "
                              "route; give the road ahead of the drive")
    if TOLD not in told:
        distance, turn = nearest_lane(road, poses[0]) or (np.inf, 0.0)
        who, at = ("the car does not lie", "") if start else ("no frame's pose lies", "at frame 0 ")
        raise TerraInputError(f"{source}: {who} on a lane of the road (within {MAX_LANE_DISTANCE_M:g} m of a "
                              f"centreline, heading within {np.degrees(MAX_HEADING_RAD):.0f} degrees of it): {at}the "
                              f"nearest lane is {distance:.1f} m away, heading {turn:.0f} degrees off the car's; give "
                              f"the road in {frame}: [x, y] in metres, x first, each lane in its driving direction")
    return routes, told


__all__ = ["EGO_ROUTES", "GivenRoutes", "ROAD", "ROUTE_HINTS", "ROUTE_KEYS", "given_routes", "road_of_setting",
           "road_routes", "told_road_routes"]
