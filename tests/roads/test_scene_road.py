"""The synthetic scene as a road gives, through the one follower, the routes the scene gives (``Scene.route``): the
ego lane's centre, not the road's centre line; facing back, the oncoming lane's."""

from __future__ import annotations

import numpy as np
import pytest

from terra.contract.routes import route_distances
from terra.roads import route_at, routes_along
from terra.sim.scene import scene_road
from tests.roads.conftest import TOLERANCE_M, drive_poses, route_offsets


@pytest.mark.parametrize("route_tokens, laterals", [(8, (0.0, -0.8, 1.2)), (16, (0.0,))])
def test_routes_from_the_scene_road_match_the_scene_at_every_frame(scenarios, route_tokens, laterals):
    """The lane's centre, and a car drifting inside its lane: within 5 cm at every point of every frame."""
    worst = 0.0
    for scenario in scenarios:
        road = scene_road(scenario.scene)
        for lateral in laterals:
            poses = drive_poses(scenario, lateral)
            ours, truth = routes_along(road, poses, route_tokens), scenario.scene.route(poses, route_tokens)
            assert ours.shape == truth.shape == (len(poses), route_tokens, 3)
            assert np.isfinite(ours).all()
            np.testing.assert_array_equal(ours[..., 2], np.broadcast_to(route_distances(route_tokens), ours.shape[:2]))
            worst = max(worst, float(np.abs(ours[..., :2] - truth[..., :2]).max()))
            on_lane = route_offsets(scenario.scene, poses, ours)[:, :-1]  # the last point may lie at the road's end
            assert np.abs(on_lane - scenario.scene.ego_lane_offset_m).max() < TOLERANCE_M  # the lane, not the road
    assert worst < TOLERANCE_M, f"max error {worst * 100:.2f} cm"


def test_a_car_heading_off_the_road_still_takes_its_lane_within_the_bound(scenarios):
    scenario = scenarios[0]
    road = scene_road(scenario.scene)
    pose = drive_poses(scenario)[50]
    for turn in (-0.9, 0.9):  # about 52 degrees each way: the car's lane, and the route in its turned frame
        turned = pose + [0.0, 0.0, turn]
        np.testing.assert_allclose(route_at(road, turned, 8), scenario.scene.route(turned, 8), atol=TOLERANCE_M)
    back = pose + [0.0, 0.0, np.pi]  # facing back along the road: the oncoming lane, 3.5 m to the car's right
    offsets = route_offsets(scenario.scene, back[None], route_at(road, back, 8)[None])
    np.testing.assert_allclose(offsets, -scenario.scene.ego_lane_offset_m, atol=TOLERANCE_M)
    assert np.isnan(route_at(road, pose + [0.0, 0.0, np.pi / 2], 8)).all()  # across the road: no lane
