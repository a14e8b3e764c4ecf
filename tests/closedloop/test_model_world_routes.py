"""A route model in the closed loop's model world: each drive is told its scenario's road ahead of every pose it
reaches (and its context frames'), a model without route slots is told nothing, a scenario without a known road
runs with "no route"; the route controls tell another scenario's road (wrong_route) or none (no_route); the controls
fed another motion tell the road ahead of the pose that motion reaches (zero_actions, straight)."""

from __future__ import annotations

import numpy as np
import pytest

from terra.closedloop.scenarios import Scenario, synthetic_scenarios
from terra.closedloop.study.control_roads import (FOREIGN_SEED, FedMotionRoad, ForeignRoad, foreign_road,
                                                  separation)
from terra.closedloop.study.control_worlds import ROUTE_CONTROLS, control_world
from terra.closedloop.worlds import ModelWorld
from terra.config.sampling import SamplingConfig
from terra.contract.routes import route_slot_values
from terra.core.errors import TerraInputError
from terra.generation.backends import model_backend
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.sim.scene import LANE_WIDTH_M, Scene
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import TINY_ROUTES, tiny_model, tiny_route_model


def told_routes(state) -> np.ndarray:
    """The routes ``[T, K, 3]`` ``[x, y, s]`` a rollout's route slots hold (they hold ``[y, x, s]``)."""
    return state.route_slots[..., [1, 0, 2]].copy()


def world_of(model) -> ModelWorld:
    return ModelWorld(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(model)),
                      SamplingConfig(temperature=0))


@pytest.fixture(scope="module")
def scenario(single_thread) -> Scenario:
    return synthetic_scenarios(1, seed=2, image_size=(64, 64), num_context=2)[0]


def test_drives_are_told_the_road_ahead_of_each_pose(scenario):
    world = world_of(tiny_route_model())
    try:
        drive = world.open(scenario, seed=1, max_frames=4)
        poses = [scenario.start_pose + [0.8 * k * np.cos(scenario.start_pose[2]), 0.8 * k * np.sin(
            scenario.start_pose[2]), 0.0] for k in range(1, 4)]
        for pose in poses:
            world.step([drive], [scenario.actions[-1]], [pose])
        state = drive.rollout.state
        expected = scenario.scene.route(np.stack([scenario.context_poses[1], *poses]), TINY_ROUTES)
        np.testing.assert_allclose(state.route_slots[:4], route_slot_values(expected), atol=1e-5)
    finally:
        world.shutdown()


def test_no_road_or_no_route_slots_means_no_route(scenario):
    roadless = Scenario("log", scenario.images, scenario.actions, scenario.speed_kmh, scenario.start_pose)
    world = world_of(tiny_route_model())
    try:
        drive = world.open(roadless, seed=1, max_frames=2)
        world.step([drive], [scenario.actions[-1]], [scenario.start_pose])
        assert np.isnan(drive.rollout.state.route_slots).all()
    finally:
        world.shutdown()
    plain = world_of(tiny_model())
    try:
        drive = plain.open(scenario, seed=1, max_frames=2)
        plain.step([drive], [scenario.actions[-1]], [scenario.start_pose])
        assert drive.rollout.state.route_slots.shape[1] == 0
    finally:
        plain.shutdown()


def _poses_ahead(scenario: Scenario, steps: int = 3) -> list[np.ndarray]:
    yaw = scenario.start_pose[2]
    return [scenario.start_pose + [0.8 * k * np.cos(yaw), 0.8 * k * np.sin(yaw), 0.0] for k in range(1, steps + 1)]


def test_a_foreign_road_carried_onto_the_own_road_is_the_true_route(scenario):
    """ForeignRoad's mapping (the car's arc length, offset and heading against the road carried onto the other road)
    is the identity when the other road is the drive's own: the true route, offset and heading included."""
    scene = scenario.scene
    poses = np.stack([scenario.start_pose + [0.0, 0.4, 0.05], *_poses_ahead(scenario)])
    np.testing.assert_allclose(ForeignRoad(scene, scene).model_routes(poses, TINY_ROUTES),
                               scene.route(poses, TINY_ROUTES), atol=1e-6)


def test_wrong_route_tells_another_scenarios_road_and_no_route_tells_none(scenario):
    """The route controls run the model world's engine with another road's route (ends metres from the true one:
    the other scene's bends) and with no route (the "no route" embedding: NaN rows in the rollout's routes)."""
    model = world_of(tiny_route_model())
    try:
        wrong, none = control_world("wrong_route", (64, 64), model), control_world("no_route", (64, 64), model)
        told = {}
        for world in (wrong, none):
            drive = world.open(scenario, seed=1, max_frames=4)
            for pose in _poses_ahead(scenario):
                world.step([drive], [scenario.actions[-1]], [pose])
            told[world.name] = told_routes(drive.rollout.state)[:4]
            world.close(drive)
        poses = np.stack([scenario.context_poses[1], *_poses_ahead(scenario)])
        true = scenario.scene.route(poses, TINY_ROUTES)
        other = foreign_road(scenario).other
        np.testing.assert_allclose(told["wrong_route"], ForeignRoad(scenario.scene, other).model_routes(
            poses, TINY_ROUTES), atol=1e-5)
        assert np.abs(told["wrong_route"][..., :2] - true[..., :2]).max() > 1.0  # metres: another road
        assert np.isnan(told["no_route"]).all()
    finally:
        model.shutdown()


def test_wrong_route_is_a_road_known_to_leave_the_true_one():
    """foreign_road tells the first candidate road that leaves the true one by a lane's width within FOREIGN_REACH_M
    of the drive's start: in the study's first 8 scenarios the told road does, each candidate skipped before it does
    not (scenario 0's first runs within 0.9 m of the true road), and a road laid onto itself is 0 m away."""
    skipped = 0
    for scenario in synthetic_scenarios(8, 0, (36, 64), indices=range(8)):
        own = scenario.scene
        start_s = own.arc_length(scenario.start_pose)
        told = foreign_road(scenario).other
        assert separation(own, own, start_s) < 1e-9
        assert separation(own, told, start_s) >= LANE_WIDTH_M
        for k in range(1, (told.seed - own.seed) // FOREIGN_SEED):
            other = Scene.generate(own.seed + k * FOREIGN_SEED, own.length_m, own.domain)
            assert separation(own, other, start_s) < LANE_WIDTH_M
            skipped += 1
    assert skipped >= 1


def _turning_poses(scenario: Scenario, steps: int = 4) -> np.ndarray:
    """A car turning left from the start: 0.8 m a step, its heading 0.1 rad more each step."""
    x, y, yaw = scenario.start_pose
    poses = []
    for _ in range(steps):
        yaw += 0.1
        x, y = x + 0.8 * np.cos(yaw), y + 0.8 * np.sin(yaw)
        poses.append([x, y, yaw])
    return np.array(poses)


def test_the_motion_controls_tell_the_road_of_the_motion_they_feed(scenario):
    """zero_actions is told the road ahead of the start at every step, straight the road ahead of the start carried
    straight on as far as the car has come along the road; neither route turns with the car (its heading leaks
    nothing), while the true route of the turning car does (metres apart at its far points)."""
    scene, start = scenario.scene, np.asarray(scenario.start_pose, dtype=np.float64)
    poses = _turning_poses(scenario)
    model = world_of(tiny_route_model())
    try:
        told = {}
        for name in ("zero_actions", "straight"):
            world = control_world(name, (64, 64), model)
            drive = world.open(scenario, seed=1, max_frames=5)
            for pose in poses:
                world.step([drive], [scenario.actions[-1]], [pose])
            told[name] = told_routes(drive.rollout.state)[1:5]  # the 4 steps' (the last context frame's first)
            world.close(drive)
    finally:
        model.shutdown()
    np.testing.assert_allclose(told["zero_actions"], scene.route(np.repeat(start[None], 4, 0), TINY_ROUTES),
                               atol=1e-5)
    s0 = scene.arc_length(start)
    ahead = scene.road_coords(poses[:, 0], poses[:, 1])[0] - s0
    straight_on = start + ahead[:, None] * np.array([np.cos(start[2]), np.sin(start[2]), 0.0])
    np.testing.assert_allclose(told["straight"], scene.route(straight_on, TINY_ROUTES), atol=1e-5)
    turned = poses + [0.0, 0.0, 0.3]
    np.testing.assert_allclose(FedMotionRoad(scene, start, True).model_routes(turned, TINY_ROUTES), told["straight"],
                               atol=1e-5)
    assert np.abs(scene.route(poses, TINY_ROUTES)[..., :2] - told["straight"][..., :2]).max() > 1.0


def test_the_route_controls_go_with_route_models_only(tmp_path):
    """controls=all adds wrong_route and no_route for a model with route slots; naming one for a model without
    any is one line."""
    from terra.closedloop.study.settings import _controls

    assert set(ROUTE_CONTROLS) <= set(_controls("all", {}, 5.0, route_tokens=4))
    assert not set(ROUTE_CONTROLS) & set(_controls("all", {}, 5.0, route_tokens=0))
    with pytest.raises(TerraInputError, match=r"^controls=\[wrong_route\] changes the route .* no route slots"):
        _controls(["frozen", "wrong_route"], {}, 5.0, route_tokens=0)
