"""A drive seen from above: the road, the route the world model was told and the path the car drove, as a PNG."""

from __future__ import annotations

import io

import numpy as np

from terra.closedloop.loop import Drive
from terra.contract.routes import route_distances
from terra.inputs.ego_motion import to_world
from terra.roads import Road

MARGIN_M = 30.0
ROUTE_EVERY = 10  # frames: a route a second
ROUTE_POINTS = 16
ROUTE_COLOR = "#ff3ce6"
PATH_COLOR = "#1f6fd0"


def scenario_road(drive: Drive) -> Road | None:
    """The road the drive's scenario tells routes from: its map's, else its scene's; None where neither is known."""
    scenario = drive.spec.scenario
    if scenario.road is not None:
        return scenario.road
    if scenario.scene is not None:
        from terra.sim.scene import scene_road

        return scene_road(scenario.scene)
    return None


def topdown_png(drive: Drive) -> bytes:
    """The drive's top-down picture as PNG bytes (matplotlib's Agg canvas, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    poses = drive.world_poses()
    shown = [poses[:, :2]]
    figure = Figure(figsize=(6, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    road = scenario_road(drive)
    if road is not None:
        axes.add_collection(LineCollection(list(road.boundaries), colors="0.2", linewidths=1.5, label="road edge"))
        axes.add_collection(LineCollection([road.lane_points(i) for i in range(len(road))], colors="0.6",
                                           linewidths=0.8, linestyles="--", label="lane centres"))
    scenario = drive.spec.scenario
    if drive.route_source is not None and drive.route_source == scenario.route_source:
        at = poses[::ROUTE_EVERY]
        routes = scenario.model_routes(at, ROUTE_POINTS)
        lines = [to_world(route[:, :2], pose) for route, pose in zip(routes, at) if np.isfinite(route).all()]
        shown += lines
        axes.add_collection(LineCollection(lines, colors=ROUTE_COLOR, linewidths=2.0, alpha=0.6,
                                           label=f"route told ({drive.route_source}; "
                                                 f"{route_distances(ROUTE_POINTS)[-1]:g} m, one a second)"))
    elif drive.route_source is not None:
        axes.plot([], [], color=ROUTE_COLOR, label=f"route told: {drive.route_source} (not drawn)")
    axes.plot(poses[:, 0], poses[:, 1], color=PATH_COLOR, linewidth=2.0, label="driven path")
    axes.plot(*poses[0, :2], "o", color=PATH_COLOR, label="start")
    points = np.concatenate(shown)
    centre = (points.min(axis=0) + points.max(axis=0)) / 2
    half = np.ptp(points, axis=0).max() / 2 + MARGIN_M
    axes.set_xlim(centre[0] - half, centre[0] + half)
    axes.set_ylim(centre[1] - half, centre[1] + half)
    axes.set_aspect("equal")
    axes.set_xlabel("x (m)")
    axes.set_ylabel("y (m)")
    axes.set_title(f"{drive.spec.id} ({drive.world})", fontsize=9)
    axes.legend(loc="upper left", fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


__all__ = ["scenario_road", "topdown_png"]
