"""Each kept frame's route of a driving-log clip, for ``terra-prepare-logs``'s shards."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terra.contract.routes import route_distances, routes_from_xy
from terra.core.errors import TerraInputError
from terra.inputs.driving_logs import ROAD_FILES, Clip
from terra.inputs.ego_motion import to_ego
from terra.inputs.trajectory import EgoTrajectory
from terra.inputs.routes import road_routes
from terra.roads import Road, read_clipgt, read_road_file

ROUTE_SOURCES = ("road", "driven_path")  # the routes setting of terra-prepare-logs


@dataclass(frozen=True)
class ClipRoutes:
    """Where a clip's routes come from: its road along its trajectory, or (``road`` None) the path it drives."""

    trajectory: EgoTrajectory
    road: Road | None = None

    def at(self, ticks: np.ndarray, points: int) -> np.ndarray:
        """Routes ``[T, points, 3]`` of the poses at ``ticks`` (the trajectory's clock)."""
        return (driven_path_routes(self.trajectory, ticks, points) if self.road is None
                else road_routes(self.road, self.trajectory, ticks, points, self.road.source)[0])


def clip_routes(clip: Clip, motion: EgoTrajectory | np.ndarray, source: str) -> ClipRoutes | None:
    """The routes of ``clip`` by ``source`` (:data:`ROUTE_SOURCES`); None where the clip has no road."""
    if source == "driven_path":
        if not isinstance(motion, EgoTrajectory):
            raise TerraInputError(f"{clip.trajectory.name}: routes=driven_path needs the car's world poses, but it "
                                  "gives per-frame actions; give a world-frame trajectory (t, x, y, yaw)")
        return ClipRoutes(motion)
    if clip.road is None:
        return None
    name = clip.road.name + ("/" if clip.road.is_dir() else "")
    if not isinstance(motion, EgoTrajectory):
        raise TerraInputError(f"{name}: a road needs the car's world poses, but {clip.trajectory.name} gives per-frame "
                              "actions; give a world-frame trajectory (t, x, y, yaw) or remove the road")
    try:
        road = read_road_file(clip.road) if clip.road.name in ROAD_FILES else read_clipgt(clip.road, source=name)
    except OSError as err:
        raise TerraInputError(f"{name}: cannot be read ({err.strerror or err})") from None
    return ClipRoutes(motion, road)


def driven_path_routes(trajectory: EgoTrajectory, ticks: np.ndarray, points: int) -> np.ndarray:
    """Routes ``[T, points, 3]`` along the trajectory's own path from each pose at ``ticks``, in its ego frame."""
    xy = np.stack([trajectory.x, trajectory.y], axis=-1)
    along = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(xy, axis=0).T))])  # the path's arc length
    poses = trajectory.poses_at(ticks)
    wanted = np.interp(ticks, trajectory.t, along)[:, None] + route_distances(points).astype(np.float64)
    world = np.stack([np.interp(wanted, along, xy[:, 0]), np.interp(wanted, along, xy[:, 1])], axis=-1)
    routes = routes_from_xy(to_ego(world, poses[:, None]))
    routes[wanted[:, -1] > along[-1] + 1e-6] = np.nan  # the recording ends before the route's reach
    return routes


__all__ = ["ROUTE_SOURCES", "ClipRoutes", "clip_routes", "driven_path_routes"]
