"""The synthetic scene as a :class:`terra.roads.Road`: an ego and an oncoming lane in pieces, the edges as bounds."""

from __future__ import annotations

import numpy as np

from terra.roads import Lane, Road
from terra.sim.scene import ROAD_HALF_WIDTH_M, Scene

SCENE_ROAD_SPACING_M = 0.25  # a chord's sag on the tightest bend (60 m radius): 0.1 mm
SCENE_LANE_PIECE_M = 100.0  # a lane's pieces, as a map splits lanes at its junctions
EGO_LANE, ONCOMING_LANE = "ego", "oncoming"  # the pieces' ids: "ego-0", "ego-1", ... in driving order


def scene_road(scene: Scene) -> Road:
    """``scene``'s road: two lanes in driving-direction pieces chained by successors, edges as boundaries."""
    ends = np.linspace(0.0, scene.length_m, max(1, round(scene.length_m / SCENE_LANE_PIECE_M)) + 1)
    pieces = [np.linspace(a, b, int(np.ceil((b - a) / SCENE_ROAD_SPACING_M)) + 1) for a, b in zip(ends, ends[1:])]
    lanes = []
    for name, offset, order in ((EGO_LANE, scene.ego_lane_offset_m, pieces),
                                (ONCOMING_LANE, -scene.ego_lane_offset_m, [s[::-1] for s in pieces[::-1]])):
        for i, s in enumerate(order):
            successors = (f"{name}-{i + 1}",) if i + 1 < len(order) else ()
            lanes.append(Lane(scene.lane_pose(s, offset)[:, :2], id=f"{name}-{i}", successors=successors))
    s = np.linspace(0.0, scene.length_m, int(np.ceil(scene.length_m / SCENE_ROAD_SPACING_M)) + 1)
    edges = [scene.lane_pose(s, side * ROAD_HALF_WIDTH_M)[:, :2] for side in (1.0, -1.0)]
    return Road(lanes, edges, source=f"scene {scene.seed} ({scene.domain})", spacing_m=SCENE_ROAD_SPACING_M)


__all__ = ["EGO_LANE", "ONCOMING_LANE", "SCENE_LANE_PIECE_M", "SCENE_ROAD_SPACING_M", "scene_road"]
