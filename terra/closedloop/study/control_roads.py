"""The roads the route controls tell a model with route slots: a foreign road, none, or the fed motion's."""

from __future__ import annotations

from typing import Callable

import numpy as np

from terra.closedloop.scenarios import Scenario
from terra.closedloop.worlds import Road
from terra.contract.routes import ROUTE_POINT_VALUES
from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import compose, to_ego
from terra.sim.scene import LANE_WIDTH_M, Scene

FOREIGN_SEED = 7919  # wrong_route: the candidate roads' scene seeds step this far from the drive's own
FOREIGN_REACH_M = 60.0  # wrong_route: the other road leaves the true one by a lane within this far of the start
FOREIGN_TRIES = 32  # wrong_route: candidate roads drawn at most


class ForeignRoad:
    """Another road told as a drive's route (``wrong_route``)."""

    route_source = "wrong_route: another scenario's road"

    def __init__(self, own: Scene, other: Scene) -> None:
        self.own, self.other = own, other

    def model_routes(self, poses: np.ndarray, route_tokens: int) -> np.ndarray:
        poses = np.asarray(poses, dtype=np.float64)
        flat = poses.reshape(-1, 3)
        s, _ = self.own.road_coords(flat[:, 0], flat[:, 1])
        at = self.own.road_pose(s)
        lateral = to_ego(flat[:, :2], at)[:, 1]  # the car's offset from the road, left +
        there = self.other.lane_pose(s, lateral)
        there[:, 2] += flat[:, 2] - at[:, 2]
        return self.other.route(there, route_tokens).reshape(poses.shape[:-1] + (route_tokens, ROUTE_POINT_VALUES))


class FedMotionRoad:
    """The road told to a model control fed another motion than the car's (``zero_actions``, ``straight``)."""

    route_source = "scene, ahead of the fed motion"

    def __init__(self, scene: Scene, start: np.ndarray, straight_on: bool) -> None:
        self.scene, self.start, self.straight_on = scene, np.asarray(start, dtype=np.float64), straight_on
        self.start_s = scene.arc_length(self.start)

    def model_routes(self, poses: np.ndarray, route_tokens: int) -> np.ndarray:
        poses = np.asarray(poses, dtype=np.float64)
        flat = poses.reshape(-1, 3)
        travelled = (self.scene.road_coords(flat[:, 0], flat[:, 1])[0] - self.start_s if self.straight_on
                     else np.zeros(len(flat)))
        reached = compose(self.start, np.stack([travelled, np.zeros_like(travelled), np.zeros_like(travelled)], -1))
        return self.scene.route(reached, route_tokens).reshape(poses.shape[:-1] + (route_tokens, ROUTE_POINT_VALUES))


class NoRoad:
    """No route told (``no_route``): the model runs with its "no route" embedding."""

    route_source = None

    def model_routes(self, poses: np.ndarray, route_tokens: int) -> None:
        return None


def foreign_road(scenario: Scenario) -> ForeignRoad:
    """``scenario``'s road carried onto another scene's, the same length and domain, drawn from its own."""
    own = scenario.scene
    if own is None:
        raise TerraInputError(f"the wrong_route control needs a scenario whose scene is known (synthetic); "
                              f"{scenario.id} has none")
    start_s = own.arc_length(scenario.start_pose)
    best, widest = None, -1.0
    for k in range(1, FOREIGN_TRIES + 1):
        other = Scene.generate(own.seed + k * FOREIGN_SEED, own.length_m, own.domain)
        gap = separation(own, other, start_s)
        if gap >= LANE_WIDTH_M:
            return ForeignRoad(own, other)
        if gap > widest:
            best, widest = other, gap
    return ForeignRoad(own, best)


def separation(own: Scene, other: Scene, start_s: float, reach_m: float = FOREIGN_REACH_M) -> float:
    """How far apart (m) the two roads' centrelines come within ``reach_m`` of arc length ``start_s``."""
    s = start_s + np.linspace(0.0, reach_m, 31)
    mine, theirs = own.road_pose(s), other.road_pose(s)
    relative = np.concatenate([to_ego(theirs[:, :2], theirs[0]), np.zeros((len(s), 1))], axis=-1)
    laid = compose(mine[0], relative)
    return float(np.hypot(*(laid[:, :2] - mine[:, :2]).T).max())


def no_road(scenario: Scenario) -> NoRoad:
    return NoRoad()


def fed_motion_road(straight_on: bool) -> Callable[[Scenario], Road]:
    """The road builder of a model control fed another motion; a scenario without a known scene keeps its own."""
    def road_of(scenario: Scenario) -> Road:
        return scenario if scenario.scene is None else FedMotionRoad(scenario.scene, scenario.start_pose, straight_on)
    return road_of
