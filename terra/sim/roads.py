"""The synthetic scene as a :class:`terra.roads.Road`: the road the scene's routes follow, for every reader of roads.

Its one lane is the scene's centreline (``Scene.route`` follows the road's centreline, not the ego lane's centre),
sampled every :data:`SCENE_ROAD_SPACING_M` and resampled as finely, so that ``routes_along(scene_road(scene), poses,
K)`` gives ``scene.route(poses, K)`` within millimetres (tests/roads/test_scene_road.py); its boundaries are the
road's two edges. Exported with ``terra.roads.write_clipgt``, a scene becomes an AlpaSim map.
"""

from __future__ import annotations

import numpy as np

from terra.roads import Lane, Road
from terra.sim.scene import ROAD_HALF_WIDTH_M, Scene

SCENE_ROAD_SPACING_M = 0.25  # a chord's sag on the tightest bend (60 m radius): 0.1 mm


def scene_road(scene: Scene) -> Road:
    """``scene``'s road: its centreline as one lane (in the direction of increasing arc length), its edges as
    boundaries."""
    s = np.linspace(0.0, scene.length_m, int(np.ceil(scene.length_m / SCENE_ROAD_SPACING_M)) + 1)
    edges = [scene.lane_pose(s, side * ROAD_HALF_WIDTH_M)[:, :2] for side in (1.0, -1.0)]
    return Road([Lane(scene.road_pose(s)[:, :2], id="centreline", successors=())], edges,
                source=f"scene {scene.seed} ({scene.domain})", spacing_m=SCENE_ROAD_SPACING_M)
